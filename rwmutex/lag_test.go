package rwmutex_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestExclusionWithClientsOnLaggingMembers runs readers and writers from clients balanced
// over a 3-member cluster while large writes keep the followers applying behind the leader,
// so watches replay events the acquiring Txns already reflect (see the mutex package's test
// of the same name). Each client's handle has several reader goroutines, which share read
// keys, and one writer. No writer may ever be inside beside anyone, and nothing may be
// reported lost.
func TestExclusionWithClientsOnLaggingMembers(t *testing.T) {
	c := etcdtest.LaggingCluster(t)

	const clients, readers, cycles = 4, 3, 60
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var inReaders, inWriters, overlaps, reads, writes, sharedReads atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		rw := newRW(t, etcdtest.SpreadClient(t, c, i), "lag")
		wg.Go(func() {
			for range cycles {
				if !assert.NoError(t, rw.Lock(ctx)) {
					return
				}
				if inWriters.Add(1) != 1 || inReaders.Load() != 0 {
					overlaps.Add(1)
				}
				inWriters.Add(-1)
				writes.Add(1)
				if !assert.NoError(t, rw.Unlock(ctx)) {
					return
				}
			}
		})
		for range readers {
			wg.Go(func() {
				for range cycles {
					if !assert.NoError(t, rw.RLock(ctx)) {
						return
					}
					if inReaders.Add(1) > 1 {
						sharedReads.Add(1)
					}
					if inWriters.Load() != 0 {
						overlaps.Add(1)
					}
					time.Sleep(time.Millisecond) // a read: lets readers overlap
					inReaders.Add(-1)
					reads.Add(1)
					if !assert.NoError(t, rw.RUnlock(ctx)) {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "out of time after %d reads and %d writes", reads.Load(), writes.Load())
	assert.Zero(t, overlaps.Load(), "a writer beside another holder")
	assert.Equal(t, int64(clients*cycles), writes.Load())
	assert.Equal(t, int64(clients*readers*cycles), reads.Load())
	assert.NotZero(t, sharedReads.Load(), "readers never overlapped")
	t.Logf("%d reads (%d beside another reader), %d writes", reads.Load(), sharedReads.Load(), writes.Load())
}
