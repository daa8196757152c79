package reentrant_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/reentrant"
)

// TestRecursiveExclusionWithClientsOnLaggingMembers contends for one lock from owners on
// clients spread over a 3-member cluster, each cycle locking 3 deep and unlocking, while
// large writes on other keys keep the followers applying behind the leader, so that a
// waiter's watch may replay deletes its snapshot already reflects (see mutex's lag test).
// Taken as news, those let a new owner in while another holds, or end a hold for nothing:
// the owning context would then be cancelled with ErrLost.
func TestRecursiveExclusionWithClientsOnLaggingMembers(t *testing.T) {
	c := etcdtest.LaggingCluster(t)

	const clients, cycles, depth = 4, 100, 3
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	handles := make([]*reentrant.Mutex, clients)
	for i := range handles {
		handles[i] = newMutex(t, etcdtest.SpreadClient(t, c, i%c.Size()), "lag")
	}
	var inside, overlaps atomic.Int64
	done, spurious := etcdtest.Cycles(ctx, clients, cycles, func(ctx context.Context, i int) error {
		return lockRecursively(ctx, handles[i], depth, &inside, &overlaps)
	})
	require.NoError(t, ctx.Err(), "out of time after %d cycles", done)

	assert.Zero(t, overlaps.Load(), "two owners at once, in %d cycles", done)
	assert.Empty(t, spurious.String(), "a cycle failed although nothing was lost: %s", spurious.String())
	assert.Equal(t, int64(clients*cycles), done)
}

// lockRecursively locks m depth deep from ctx, each level with the context of the one
// above, and unlocks on the way back; it counts an overlap whenever another owner is inside
// at the top level, and fails if the owning context ended before the last Unlock.
func lockRecursively(ctx context.Context, m *reentrant.Mutex, depth int, inside, overlaps *atomic.Int64) error {
	octx, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	if inside.Add(1) != 1 {
		overlaps.Add(1)
	}
	err = nest(octx, m, depth-1)
	if err == nil && octx.Err() != nil {
		err = context.Cause(octx)
	}
	inside.Add(-1)
	return errors.Join(err, m.Unlock(octx))
}

func nest(ctx context.Context, m *reentrant.Mutex, depth int) error {
	if depth == 0 {
		return nil
	}
	if _, err := m.Lock(ctx); err != nil {
		return err
	}
	return errors.Join(nest(ctx, m, depth-1), m.Unlock(ctx))
}
