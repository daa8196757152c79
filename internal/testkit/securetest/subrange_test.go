package securetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// A read lock and a semaphore permit write and read only a part of their name (the read/
// and write/ kinds; the permit/ kind and the limit record), while a waiter watches the whole
// name. User split is granted just those parts: its acquisitions are allowed, its waits are
// not. These tests say what a refused wait must do: fail at once with ErrPermissionDenied
// and leave no key, like a refused acquisition. (Every other primitive reads the whole name
// in the Txn that queues it, so its refusal comes there.)

// TestReadWaitOutsideGrantIsRefused: user split takes a read lock of splitRW, uncontended;
// while root holds the write lock, its RLock, allowed to queue, is refused its wait.
func TestReadWaitOutsideGrantIsRefused(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	keys := splitPrefix + core.NamePrefix(splitRW)
	reader, err := rwmutex.New(cluster.ClientAs(t, splitUser), splitRW, rwmutex.WithPrefix(splitPrefix))
	require.NoError(t, err)
	require.NoError(t, reader.RLock(ctx), "an uncontended read lock is inside the grant")
	require.NoError(t, reader.RUnlock(ctx))

	writer, err := rwmutex.New(admin, splitRW, rwmutex.WithPrefix(splitPrefix))
	require.NoError(t, err)
	require.NoError(t, writer.Lock(ctx))
	assertWaitRefused(t, reader.RLock, "RLock behind a writer")
	require.NoError(t, writer.Unlock(ctx))
	assert.Zero(t, count(t, admin, keys), "keys left")
}

// TestPermitWaitOutsideGrantIsRefused: user split holds the one permit of splitSem; its
// second Acquire, allowed to queue, is refused its wait.
func TestPermitWaitOutsideGrantIsRefused(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	keys := splitPrefix + core.NamePrefix(splitSem)
	holder, err := semaphore.New(cluster.ClientAs(t, splitUser), splitSem, 1, semaphore.WithPrefix(splitPrefix))
	require.NoError(t, err)
	waiter, err := semaphore.New(cluster.ClientAs(t, splitUser), splitSem, 1, semaphore.WithPrefix(splitPrefix))
	require.NoError(t, err)
	permit, err := holder.Acquire(ctx)
	require.NoError(t, err, "an uncontended permit is inside the grant")
	assertWaitRefused(t, func(ctx context.Context) error {
		p, err := waiter.Acquire(ctx)
		if err == nil {
			_ = p.Release(ctx)
		}
		return err
	}, "Acquire behind a holder")
	require.NoError(t, permit.Release(ctx))
	assertNoLockKeys(t, admin, keys)
}

// assertWaitRefused checks that wait returns within refusedWithin an error matching
// ErrPermissionDenied; a wait still running then is cancelled, and awaited, so that its
// cleanup runs before the test goes on.
func assertWaitRefused(t *testing.T, wait func(context.Context) error, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	defer cancel()
	done := etcdtest.Async(func() error { return wait(ctx) })
	select {
	case err := <-done:
		assert.ErrorIs(t, err, rpctypes.ErrPermissionDenied, what)
		t.Logf("%s: %v", what, err)
	case <-time.After(refusedWithin):
		cancel()
		t.Errorf("%s: still waiting %v after its watch was refused; cancelled: %v", what, refusedWithin, <-done)
	}
}

// TestIsOwnerWithoutAHoldStaysInsideTheGrant: user split, granted only the kinds of its
// names, fences a write with the IsOwner of a released permit and of an RWMutex without a
// write hold. Each compare lies inside the grant: the Txn is answered, and its compare
// fails, instead of being refused for permission.
func TestIsOwnerWithoutAHoldStaysInsideTheGrant(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.ClientAs(t, splitUser)
	sem, err := semaphore.New(cli, splitSem, 1, semaphore.WithPrefix(splitPrefix))
	require.NoError(t, err)
	permit, err := sem.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, permit.Release(ctx))
	rw, err := rwmutex.New(cli, splitRW, rwmutex.WithPrefix(splitPrefix))
	require.NoError(t, err)

	for what, cmp := range map[string]clientv3.Cmp{"released permit": permit.IsOwner(), "RWMutex without a write hold": rw.IsOwner()} {
		resp, err := cli.Txn(ctx).If(cmp).Commit()
		if assert.NoError(t, err, "%s: compare on %q", what, cmp.KeyBytes()) {
			assert.False(t, resp.Succeeded, what)
		}
	}
}
