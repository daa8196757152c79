package mutex_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
)

func TestMutualExclusionAcrossClients(t *testing.T) {
	handles := make([]*mutex.Mutex, 4)
	for i := range handles {
		handles[i] = newMutex(t, cluster.Client(t), "exclusion")
	}
	lockInTurns(t, handles, 10)
}

func TestSharedHandleLetsOneGoroutineInAtATime(t *testing.T) {
	m := newMutex(t, cluster.Client(t), "shared-handle")
	lockInTurns(t, []*mutex.Mutex{m, m, m, m, m, m}, 8)
	assert.ErrorIs(t, m.Unlock(etcdtest.Context(t)), mutex.ErrNotLocked)
}

// lockInTurns runs a goroutine per entry of handles (a handle may appear more than once),
// each locking and unlocking rounds times, and fails the test if two are ever inside at
// once or a cycle fails.
func lockInTurns(t *testing.T, handles []*mutex.Mutex, rounds int) {
	ctx := etcdtest.Context(t)
	var inside, total atomic.Int64
	var wg sync.WaitGroup
	for _, m := range handles {
		wg.Go(func() {
			for range rounds {
				if !assert.NoError(t, m.Lock(ctx)) {
					return
				}
				assert.Equal(t, int64(1), inside.Add(1), "two holders at once")
				total.Add(1)
				inside.Add(-1)
				assert.NoError(t, m.Unlock(ctx))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(len(handles)*rounds), total.Load())
}

// TestAHoldingHandlesOwnTryLockFails: a Mutex never re-enters, not even by TryLock (the
// try of another handle: primtest's TestAFailedTryReturnsAtOnceAndWritesNothing).
func TestAHoldingHandlesOwnTryLockFails(t *testing.T) {
	ctx := etcdtest.Context(t)
	holder := newMutex(t, cluster.Client(t), "try-own")
	require.NoError(t, holder.TryLock(ctx))
	before := etcdtest.Revision(t, cluster.Client(t))
	assert.ErrorIs(t, holder.TryLock(ctx), mutex.ErrLocked)
	etcdtest.NoWrites(t, cluster.Client(t), before, "a failed TryLock wrote")
	require.NoError(t, holder.Unlock(ctx))
}

// TestWithPrefixKeepsKeysUnderItAndNamesApart: under WithPrefix, a name's keys lie below the
// prefix, names with '/' stay independent of their parents, and a plain name shares etcd's
// layout for prefix+name, so etcd's Mutex on "app/lock" excludes ours on "lock".
func TestWithPrefixKeepsKeysUnderItAndNamesApart(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	const prefix = "tenant-a/"
	names := []string{"lock", "lock/sub", "lock/", "locks"}
	held := make([]*mutex.Mutex, len(names))
	for i, name := range names {
		held[i] = newMutex(t, cli, name, mutex.WithPrefix(prefix))
		require.NoError(t, held[i].TryLock(ctx), "name %q blocked by another", name)
	}
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	assert.Len(t, resp.Kvs, len(names), "every hold's key lies under the prefix")
	assert.Zero(t, primtest.Keys(t, cli, "lock"), "a name outside the prefix sees the prefixed holds")
	for _, m := range held {
		require.NoError(t, m.Unlock(ctx))
	}

	sess, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer sess.Close()
	theirs := concurrency.NewMutex(sess, prefix+"lock")
	require.NoError(t, theirs.Lock(ctx))
	assert.ErrorIs(t, newMutex(t, cli, "lock", mutex.WithPrefix(prefix)).TryLock(ctx), mutex.ErrLocked)
	sub := newMutex(t, cli, "lock/sub", mutex.WithPrefix(prefix))
	require.NoError(t, sub.TryLock(ctx), "a nested name is independent")
	require.NoError(t, sub.Unlock(ctx))
	require.NoError(t, theirs.Unlock(ctx))
}

func TestAHolderThatStopsRenewingLosesTheLockAndItsFence(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "stops-renewing"
	cli := cluster.Client(t)
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
	require.NoError(t, err)
	holder := newMutex(t, cli, name, mutex.WithSession(sess))
	require.NoError(t, holder.Lock(ctx))
	done := holder.Done()

	waiter := newMutex(t, cluster.Client(t), name)
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock(ctx) }()
	primtest.AwaitKeys(t, cli, name, 2)

	fencedPut := func(m *mutex.Mutex, v string) bool {
		resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("stops-renewing-data", v)).Commit()
		require.NoError(t, err)
		return resp.Succeeded
	}
	sess.Orphan() // the process stalls: no more keep-alives, but the lease lives out its TTL
	etcdtest.Within(t, done, 3*time.Second, "Done closes once the session can no longer renew")
	assert.ErrorIs(t, holder.Err(), mutex.ErrLost)

	require.NoError(t, etcdtest.Within(t, errc, 10*time.Second, "the waiter is served after the lease expires"))
	assert.False(t, fencedPut(holder, "stale"), "the stalled holder's fenced write applied after the lease expired")
	assert.True(t, fencedPut(waiter, "fresh"))
	assert.ErrorIs(t, holder.Unlock(ctx), mutex.ErrLost)
	require.NoError(t, waiter.Unlock(ctx))
}

func TestLateUnlockNeverDeletesANewerHoldsKey(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	m := newMutex(t, cluster.Client(t), "late-unlock")
	require.NoError(t, m.Lock(ctx))
	key, done := m.Key(), m.Done()
	get, err := admin.Get(ctx, key)
	require.NoError(t, err)
	lease := clientv3.LeaseID(get.Kvs[0].Lease)

	// The key is deleted and written again under the same lease: a newer hold on the same
	// key, as etcd's own Mutex makes when one session locks again.
	_, err = admin.Delete(ctx, key)
	require.NoError(t, err)
	etcdtest.Within(t, done, 3*time.Second, "Done closes when the key is deleted")
	_, err = admin.Put(ctx, key, "", clientv3.WithLease(lease))
	require.NoError(t, err)

	assert.ErrorIs(t, m.Unlock(ctx), mutex.ErrLost)
	after, err := admin.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, after.Kvs, 1, "the late Unlock deleted the newer hold's key")
	_, err = admin.Delete(ctx, key)
	require.NoError(t, err)
}

func TestExcludesEtcdConcurrencyMutexBothWays(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "interop"
	ours := newMutex(t, cluster.Client(t), name)
	sess, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer sess.Close()
	theirs := concurrency.NewMutex(sess, name)

	// Ours first: theirs cannot get in until ours unlocks.
	require.NoError(t, ours.Lock(ctx))
	assert.ErrorIs(t, theirs.TryLock(ctx), concurrency.ErrLocked)
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	assert.ErrorIs(t, theirs.Lock(tctx), context.DeadlineExceeded)
	cancel()
	theirsLocked := make(chan error, 1)
	go func() { theirsLocked <- theirs.Lock(ctx) }()
	primtest.AwaitKeys(t, sess.Client(), name, 2)
	require.NoError(t, ours.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, theirsLocked, 10*time.Second, "etcd's Mutex gets the lock after ours"))

	// Theirs first: ours cannot get in until theirs unlocks.
	assert.ErrorIs(t, ours.TryLock(ctx), mutex.ErrLocked)
	oursLocked := make(chan error, 1)
	go func() { oursLocked <- ours.Lock(ctx) }()
	primtest.AwaitKeys(t, sess.Client(), name, 2)
	require.NoError(t, theirs.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, oursLocked, 10*time.Second, "ours gets the lock after etcd's Mutex"))
	require.NoError(t, ours.Unlock(ctx))
}

func TestClosingTheClientEndsAWaitingLock(t *testing.T) {
	t.Parallel()
	ctx := etcdtest.Context(t)
	const name = "client-closed"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))

	// The session lives on another client, so only the waiter's own client closes.
	sess, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer sess.Close()
	cli, err := cluster.NewClient()
	require.NoError(t, err)
	waiter := newMutex(t, cli, name, mutex.WithSession(sess))
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock(ctx) }()
	primtest.AwaitKeys(t, admin, name, 2)
	require.NoError(t, cli.Close())
	assert.Error(t, etcdtest.Within(t, errc, 10*time.Second, "Lock returns once its client is closed"))
	require.NoError(t, holder.Unlock(ctx))
}

func TestWithSessionUsesTheCallersLease(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	require.NoError(t, err)
	m := newMutex(t, cli, "with-session", mutex.WithSession(sess))
	require.NoError(t, m.Lock(ctx))
	resp, err := cli.Get(ctx, m.Key())
	require.NoError(t, err)
	assert.Equal(t, int64(sess.Lease()), resp.Kvs[0].Lease)
	require.NoError(t, m.Unlock(ctx))

	require.NoError(t, sess.Close())
	assert.ErrorIs(t, m.Lock(ctx), mutex.ErrLost, "Lock on an expired caller's session")
	assert.Zero(t, primtest.Keys(t, cli, "with-session"))
}

// TestLocksCancelledAtAnyMomentLeaveNoKey cancels waiting Locks at random moments, also
// while their enqueue Txn is in flight: a Txn cancelled there may still be applied by etcd,
// after the delete meant to undo it, and its key would then queue ahead of everyone for as
// long as the client's lease lives.
//
// It runs on a 3-member cluster with clients balanced over the members, where a Txn that a
// follower forwards to the leader is easily overtaken by a delete sent to the leader.
func TestLocksCancelledAtAnyMomentLeaveNoKey(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()
	ctx := etcdtest.Context(t)
	const name, tries = "cancel-any", 300
	admin := etcdtest.SpreadClient(t, c, 0)
	holder := newMutex(t, etcdtest.SpreadClient(t, c, 0), name)
	require.NoError(t, holder.Lock(ctx))
	waiters := make([]*mutex.Mutex, 6)
	for i := range waiters {
		waiters[i] = newMutex(t, etcdtest.SpreadClient(t, c, i%3), name)
	}
	var wg sync.WaitGroup
	for _, m := range waiters {
		wg.Go(func() {
			for i := range tries {
				lctx, cancel := context.WithTimeout(ctx, time.Duration(i%40)*50*time.Microsecond)
				err := m.Lock(lctx)
				cancel()
				if !assert.Error(t, err, "served while the holder holds") {
					return
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name), "cancelled Locks left keys")
	require.NoError(t, holder.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestLockOnARevokedCallerSessionFailsAtOnce: a WithSession session whose lease was revoked
// cannot be replaced; Lock says ErrLost at once, before the session's keep-alive notices,
// with one Txn, not a retry loop until then.
func TestLockOnARevokedCallerSessionFailsAtOnce(t *testing.T) {
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	require.NoError(t, err)
	defer sess.Close()
	m := newMutex(t, cli, "revoked-session", mutex.WithSession(sess))
	_, err = cluster.Client(t).Revoke(ctx, sess.Lease())
	require.NoError(t, err)

	before := cnt.Counts()
	assert.ErrorIs(t, m.Lock(ctx), mutex.ErrLost)
	// One Txn, or none when the session's own keep-alive noticed first.
	assert.LessOrEqual(t, cnt.Counts().Sub(before)["Txn"], int64(1), "Lock retried on a lease that is gone")
	assert.Zero(t, primtest.Keys(t, cluster.Client(t), "revoked-session"))
}
