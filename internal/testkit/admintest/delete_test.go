package admin_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// TestDeleteRemovesLastingRecordsOnlyWhenUnused: a semaphore's limit record, a barrier's
// records and a latch's count outlive their users, and a lock of the name is refused
// (ErrOtherKind) while they are there. Delete refuses while a permit holds, naming its key
// and owner, having deleted nothing; once nobody holds, it removes every record, and the
// name can be locked. A name with nothing under it is no error.
func TestDeleteRemovesLastingRecordsOnlyWhenUnused(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli, op := cluster.Client(t), cluster.Client(t)
	const sem, bar, lat, none = "admin-delete-sem", "admin-delete-barrier", "admin-delete-latch", "admin-delete-none"

	s := must(semaphore.New(cli, sem, 2))
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	b := must(barrier.New(cli, bar, 1))
	require.NoError(t, b.Enter(ctx))
	require.NoError(t, b.Leave(ctx))
	require.NoError(t, must(latch.New(cli, lat)).Set(ctx, 3))

	before := etcdtest.Revision(t, op)
	err = admin.Delete(ctx, op, []string{sem, bar, lat})
	assert.ErrorIs(t, err, admin.ErrInUse)
	assert.ErrorContains(t, err, p.Key())
	assert.ErrorContains(t, err, "pid=")
	etcdtest.NoWrites(t, op, before, "a refused Delete wrote")

	require.NoError(t, p.Release(ctx))
	for _, name := range []string{sem, bar, lat} {
		assert.ErrorIs(t, must(mutex.New(cli, name)).Lock(ctx), etcdsync.ErrOtherKind, "a lock of %s, with its records", name)
	}
	require.NoError(t, admin.Delete(ctx, op, []string{sem, bar, lat, none}))
	for _, name := range []string{sem, bar, lat} {
		assert.Zero(t, etcdtest.CountKeys(t, op, core.NamePrefix(name)), "%s: no key left", name)
		m := must(mutex.New(cli, name))
		require.NoError(t, m.Lock(ctx), "a lock of %s once its records are gone", name)
		require.NoError(t, m.Unlock(ctx))
	}
	require.NoError(t, admin.Delete(ctx, op, []string{none}))
	assert.ErrorIs(t, admin.Delete(ctx, op, nil), core.ErrInvalidName)
	assert.ErrorIs(t, admin.Delete(ctx, op, []string{""}), core.ErrInvalidName)
	assert.ErrorIs(t, admin.Delete(ctx, op, []string{"a"}, admin.Prefix("app")), core.ErrInvalidOption)
}
