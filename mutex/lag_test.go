package mutex_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/etcdtest"
)

// TestExclusionWithClientsOnLaggingMembers contends for one mutex from clients pinned to each
// member of a 3-member cluster, while large writes on other keys keep the followers applying
// behind the leader. A waiter's watch served by a follower then starts below the revision of
// the waiter's own Txn and replays deletes the waiter's snapshot already reflects: the delete
// of an earlier incarnation of its own reused key, or of a predecessor's key that was
// re-created before the snapshot. Taken as news, the first is a spurious ErrLost and the
// second lets the waiter in while its predecessor holds.
func TestExclusionWithClientsOnLaggingMembers(t *testing.T) {
	c := etcdtest.LaggingCluster(t)

	const clients, cycles = 6, 350 // per client: 2,100 lock cycles
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var inside, overlaps, done atomic.Int64
	var spurious etcdtest.Tally // Lock errors although nothing was lost
	var wg sync.WaitGroup
	for i := range clients {
		m := newMutex(t, etcdtest.SpreadClient(t, c, i%c.Size()), "lag")
		wg.Go(func() {
			for n := 0; n < cycles && ctx.Err() == nil; {
				if err := m.Lock(ctx); err != nil {
					if ctx.Err() == nil {
						spurious.Add(err)
					}
					continue
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				inside.Add(-1)
				if err := m.Unlock(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("unlock: %v", err)
				}
				n++
				done.Add(1)
			}
		})
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "out of time after %d cycles", done.Load())

	assert.Zero(t, overlaps.Load(), "two holders at once, in %d cycles", done.Load())
	assert.Empty(t, spurious.String(), "Lock failed although nothing was lost: %s", spurious.String())
	assert.Equal(t, int64(clients*cycles), done.Load())
}
