package trylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/semaphore"
	"github.com/etcdsync/etcdsync/trylock"
)

// TestPermitsOfASemaphore: the generic adapter over a real *semaphore.Semaphore fails with
// ErrNoPermits, writes nothing, and its retry wakes when a permit is released.
func TestPermitsOfASemaphore(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-semaphore"
	admin, cli := cluster.Client(t), cluster.Client(t)
	_, err := admin.Delete(ctx, name+"/limit") // a limit recorded by an earlier -count run
	require.NoError(t, err)
	other, err := semaphore.New(cluster.Client(t), name, 1)
	require.NoError(t, err)
	mine, err := semaphore.New(cli, name, 1)
	require.NoError(t, err)

	// A contended acquisition first, so that cli's watch of the name is running.
	first, err := other.Acquire(ctx)
	require.NoError(t, err)
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := mine.Acquire(ctx)
		if err != nil {
			p = nil
		}
		got <- p
	}()
	etcdtest.AwaitKeys(t, admin, name+"/permit/", 2)
	require.NoError(t, first.Release(ctx))
	held := etcdtest.Within(t, got, 10*time.Second, "the queued Acquire")
	require.NotNil(t, held)

	before := etcdtest.Revision(t, admin)
	l := trylock.Permits(mine)
	require.ErrorIs(t, trylock.Once(ctx, l), trylock.ErrNoPermits)
	etcdtest.NoWrites(t, admin, before, "a failed try wrote")

	retryAfterRelease(t, l, trylock.ErrNoPermits, held.Release)
	require.NotNil(t, l.Permit())
	require.NoError(t, l.Permit().Release(context.Background()))
}

// TestPermitsNTakesEveryUnitOrNone: over a semaphore of 4 with 2 units held, a Locker of 3
// units fails with ErrNoPermits and writes nothing; its retry wakes when the 2 are released
// and takes 3 units in one permit; n out of range is the semaphore's ErrInvalidOption.
func TestPermitsNTakesEveryUnitOrNone(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-semaphore-n"
	admin := cluster.Client(t)
	_, err := admin.Delete(ctx, name+"/limit") // a limit recorded by an earlier -count run
	require.NoError(t, err)
	other, err := semaphore.New(cluster.Client(t), name, 4)
	require.NoError(t, err)
	mine, err := semaphore.New(cluster.Client(t), name, 4)
	require.NoError(t, err)
	// mine's 2 units wait behind other's 4 and take them on its release: mine's client then
	// has a watch of the name that has dispatched a delete, so the retry's first wait cannot
	// end on a delete from before it (an uncontended warm-up's release could: CI, 3.6.16).
	block, err := other.AcquireN(ctx, 4)
	require.NoError(t, err)
	got := make(chan *semaphore.Permit, 1)
	go func() {
		p, err := mine.AcquireN(ctx, 2)
		if err != nil {
			p = nil
		}
		got <- p
	}()
	etcdtest.AwaitKeys(t, admin, name+"/permit/", 2)
	require.NoError(t, block.Release(ctx))
	held := etcdtest.Within(t, got, 10*time.Second, "the queued AcquireN")
	require.NotNil(t, held)

	before := etcdtest.Revision(t, admin)
	l := trylock.PermitsN(mine, 3)
	require.ErrorIs(t, trylock.Once(ctx, l), trylock.ErrNoPermits)
	etcdtest.NoWrites(t, admin, before, "a failed try of 3 units wrote")

	retryAfterRelease(t, l, trylock.ErrNoPermits, held.Release)
	require.NotNil(t, l.Permit())
	require.Equal(t, 3, l.Permit().Units())
	require.NoError(t, l.Permit().Release(context.Background()))

	require.ErrorIs(t, trylock.Once(ctx, trylock.PermitsN(mine, 5)), trylock.ErrInvalidOption)
	require.ErrorIs(t, trylock.Once(ctx, trylock.PermitsN[*semaphore.Permit](nil, 1)), trylock.ErrInvalidOption)
	etcdtest.AwaitKeys(t, admin, name+"/permit/", 0)
}
