package semaphore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestLimitHoldsWithClientsOnLaggingMembers contends for a semaphore from clients spread
// over a 3-member cluster, while large writes on other keys keep the followers applying
// behind the leader, so that waiters' watches replay deletes their snapshots already
// reflect. Taken as news, such a delete would let a waiter in beside holders of every unit,
// or report its own earlier key's delete as a spurious ErrLost. Permits are of 1 to 3 units
// of 4, so that the replayed deletes carry weights too.
func TestLimitHoldsWithClientsOnLaggingMembers(t *testing.T) {
	c := etcdtest.LaggingCluster(t)

	const clients, perClient, cycles, limit = 6, 2, 80, 4 // 960 permit cycles
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var inside, peak, over, done atomic.Int64
	var spurious etcdtest.Tally // Lock errors although nothing was lost
	var wg sync.WaitGroup
	for i := range clients {
		cli := etcdtest.SpreadClient(t, c, i%c.Size())
		s := newSemaphore(t, cli, "lag", limit)
		for g := range perClient {
			wg.Go(func() {
				for n := 0; n < cycles && ctx.Err() == nil; {
					units := 1 + (i+g+n)%3
					p, err := s.AcquireN(ctx, units)
					if err != nil {
						if ctx.Err() == nil {
							spurious.Add(err)
						}
						continue
					}
					k := inside.Add(int64(units))
					if k > limit {
						over.Add(1)
					}
					for old := peak.Load(); k > old && !peak.CompareAndSwap(old, k); old = peak.Load() {
					}
					// The work: a fenced write, which a lost permit could not make.
					resp, err := cli.Txn(ctx).If(p.IsOwner()).Then(clientv3.OpPut("lag-work", "x")).Commit()
					if err == nil && !resp.Succeeded {
						t.Errorf("a fenced write under a permit that was not lost failed")
					}
					inside.Add(-int64(units))
					if err := p.Release(ctx); err != nil && ctx.Err() == nil {
						t.Errorf("release: %v", err)
					}
					n++
					done.Add(1)
				}
			})
		}
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "out of time after %d cycles", done.Load())

	assert.Zero(t, over.Load(), "more than %d units held at once, in %d cycles", limit, done.Load())
	t.Logf("%d cycles, peak units held %d", done.Load(), peak.Load())
	assert.Empty(t, spurious.String(), "Acquire failed although nothing was lost: %s", spurious.String())
	assert.Equal(t, int64(clients*perClient*cycles), done.Load())
}
