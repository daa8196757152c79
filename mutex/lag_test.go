package mutex_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
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

	const clients, cycles = 6, 175 // per client: 1,050 lock cycles
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	handles := make([]*mutex.Mutex, clients)
	for i := range handles {
		handles[i] = newMutex(t, etcdtest.SpreadClient(t, c, i%c.Size()), "lag")
	}
	var inside, overlaps atomic.Int64
	done, spurious := etcdtest.Cycles(ctx, clients, cycles, func(ctx context.Context, i int) error {
		if err := handles[i].Lock(ctx); err != nil {
			return err
		}
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		inside.Add(-1)
		if err := handles[i].Unlock(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("unlock: %v", err)
		}
		return nil
	})
	require.NoError(t, ctx.Err(), "out of time after %d cycles", done)

	assert.Zero(t, overlaps.Load(), "two holders at once, in %d cycles", done)
	assert.Empty(t, spurious.String(), "Lock failed although nothing was lost: %s", spurious.String())
	assert.Equal(t, int64(clients*cycles), done)
}
