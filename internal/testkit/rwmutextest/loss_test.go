package rwmutex_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// TestNoReaderOfALostHoldIsToldItsReadWasSound: reader R1 holds through the handle's read
// key; the key's lease is revoked and a writer elsewhere is served, writes and unlocks. Once
// the handle knows, a new reader R2 must not start a fresh read hold whose clean RUnlock
// could be taken for R1's (RUnlock does not say which reader leaves): R2 waits until R1 has
// left, R1 is told ErrLost, and only then R2 reads, soundly.
func TestNoReaderOfALostHoldIsToldItsReadWasSound(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "lost-read"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	require.NoError(t, rw.RLock(ctx)) // R1
	done := rw.Done()
	resp, err := admin.Get(ctx, core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	writer := newRW(t, cluster.Client(t), name)
	require.NoError(t, writer.Lock(ctx))
	require.NoError(t, writer.Unlock(ctx))
	etcdtest.Within(t, done, 10*time.Second, "the handle learns its read hold was lost")

	second := etcdtest.Async(func() error { return rw.RLock(ctx) }) // R2
	time.Sleep(200 * time.Millisecond)                              // R2 would have its own key by now
	etcdtest.Pending(t, second, "a new reader while a reader of the lost hold is still in")
	assert.ErrorIs(t, rw.TryRLock(ctx), rwmutex.ErrLocked)
	assert.ErrorIs(t, rw.RUnlock(ctx), rwmutex.ErrLost, "R1")
	require.NoError(t, etcdtest.Within(t, second, 10*time.Second, "R2 once R1 has left"))
	assert.NoError(t, rw.RUnlock(ctx), "R2")
	assert.ErrorIs(t, rw.RUnlock(ctx), rwmutex.ErrNotLocked)
}
