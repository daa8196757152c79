package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestAHolderCutOffDuringUnlockIsToldItLost cuts a holder's member off from its peers just
// as the holder unlocks. The member cannot commit the fenced delete and answers "request
// timed out", which Unlock retries; meanwhile the holder's lease, no longer renewed, expires
// and a client of another member takes the lock. Once healed, Unlock's next try finds the key
// gone: the work of its own first try, whose answer was lost, or of the lease's expiry. Only
// the lease can tell, here it says the hold was lost, and Unlock must say ErrLost, never nil.
// Found by the fault harness (holder paused), where Unlock returned nil.
func TestAHolderCutOffDuringUnlockIsToldItLost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, err := etcdtest.NewEmbedded(3, etcdtest.WithPeerProxies())
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const name = "cut-off-unlock"
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	cut, other := (leader+1)%3, (leader+2)%3

	holder := newMutex(t, etcdtest.PinnedClient(t, c, cut), name, mutex.WithTTL(time.Second))
	require.NoError(t, holder.Lock(ctx))
	next := newMutex(t, etcdtest.PinnedClient(t, c, other), name)
	served := make(chan error, 1)
	go func() { served <- next.Lock(ctx) }()
	primtest.AwaitKeys(t, etcdtest.PinnedClient(t, c, leader), name, 2)

	c.Partition(cut)
	unlocked := make(chan error, 1)
	go func() { unlocked <- holder.Unlock(ctx) }()
	require.NoError(t, etcdtest.Within(t, served, 30*time.Second, "the other client is served once the holder's lease expires"))
	c.Heal(cut)
	assert.ErrorIs(t, etcdtest.Within(t, unlocked, 60*time.Second, "Unlock returns once healed"), mutex.ErrLost)
	require.NoError(t, next.Unlock(ctx))
}
