package reentrant_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/reentrant"
)

func TestLossCancelsTheOwningContextWithErrLost(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "lost"
	admin := cluster.Client(t)
	cli := cluster.Client(t)
	sess, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	m := newMutex(t, cli, name, reentrant.WithSession(sess))
	octx, err := m.Lock(ctx)
	require.NoError(t, err)
	_, err = m.Lock(octx)
	require.NoError(t, err)
	done := m.Done()

	_, err = admin.Revoke(ctx, sess.Lease())
	require.NoError(t, err)
	etcdtest.Within(t, octx.Done(), 5*time.Second, "the owning context is cancelled after the lease is revoked")
	assert.ErrorIs(t, context.Cause(octx), reentrant.ErrLost)
	etcdtest.Within(t, done, 5*time.Second, "Done closes after the lease is revoked")
	assert.ErrorIs(t, m.Err(), reentrant.ErrLost)
	assert.NoError(t, ctx.Err(), "the caller's context was cancelled")

	// A nested step learns of the loss, and does not queue for a new hold.
	rev := etcdtest.Revision(t, admin)
	_, err = m.Lock(octx)
	assert.ErrorIs(t, err, reentrant.ErrLost)
	assert.Equal(t, 2, m.Count(octx))
	etcdtest.NoWrites(t, admin, rev, "a Lock with a lost owner wrote")

	// Every Unlock reports the loss and counts down; the last one ends the hold.
	assert.ErrorIs(t, m.Unlock(octx), reentrant.ErrLost)
	assert.Equal(t, 1, m.Count(octx))
	assert.ErrorIs(t, m.Err(), reentrant.ErrLost)
	assert.ErrorIs(t, m.Unlock(octx), reentrant.ErrLost)
	assert.Zero(t, m.Count(octx))
	assert.ErrorIs(t, m.Err(), reentrant.ErrNotLocked)
	assert.ErrorIs(t, m.Unlock(octx), reentrant.ErrNotLocked)
	assert.ErrorIs(t, context.Cause(octx), reentrant.ErrLost)
	assert.Empty(t, keysOf(t, admin, name))
}

func TestLossOfTheSharedLeaseServesTheNextOwnerAndIsRecovered(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "lost-shared"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	octx, err := holder.Lock(ctx)
	require.NoError(t, err)

	waiter := newMutex(t, cluster.Client(t), name)
	served := make(chan context.Context, 1)
	go func() {
		wctx, err := waiter.Lock(ctx)
		assert.NoError(t, err)
		served <- wctx
	}()
	primtest.AwaitKeys(t, admin, name, 2)
	_, err = admin.Revoke(ctx, clientv3.LeaseID(keysOf(t, admin, name)[0].Lease))
	require.NoError(t, err)

	etcdtest.Within(t, octx.Done(), 5*time.Second, "the owning context is cancelled after the lease is revoked")
	assert.ErrorIs(t, context.Cause(octx), reentrant.ErrLost)
	wctx := etcdtest.Within(t, served, 5*time.Second, "the next owner is served")
	assert.NoError(t, waiter.Err())
	assert.ErrorIs(t, holder.Unlock(octx), reentrant.ErrLost)
	assert.Len(t, keysOf(t, admin, name), 1, "the lost owner's Unlock touched the next hold")

	// The revoked session is replaced for the handle's next owner.
	relocked := make(chan error, 1)
	go func() {
		rctx, err := holder.Lock(ctx)
		if err == nil {
			err = holder.Unlock(rctx)
		}
		relocked <- err
	}()
	primtest.AwaitKeys(t, admin, name, 2)
	require.NoError(t, waiter.Unlock(wctx))
	require.NoError(t, etcdtest.Within(t, relocked, 10*time.Second, "the lost owner's handle locks again"))
	assert.Empty(t, keysOf(t, admin, name))
}

func TestTheLastUnlockReleasesWithADoneOwningContext(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "done-owner"
	admin := cluster.Client(t)
	m := newMutex(t, cluster.Client(t), name)
	parent, cancel := context.WithCancel(ctx)
	octx, err := m.Lock(parent)
	require.NoError(t, err)
	_, err = m.Lock(octx)
	require.NoError(t, err)

	cancel() // the job is cancelled: the hold lasts until its Unlocks
	assert.NoError(t, m.Err())
	_, err = m.Lock(octx)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 2, m.Count(octx), "a Lock with a done context counted")
	require.NoError(t, m.Unlock(octx))
	assert.Len(t, keysOf(t, admin, name), 1)
	require.NoError(t, m.Unlock(octx))
	assert.Empty(t, keysOf(t, admin, name), "the last Unlock with a done context left the key")
	assert.Zero(t, m.Count(octx))
}

// TestUnlockThatCannotReachEtcdKeepsTheHoldForARetry cuts the holder's client off from etcd
// during its last Unlock: the count stays at 1, and a later Unlock releases.
func TestUnlockThatCannotReachEtcdKeepsTheHoldForARetry(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "unreachable"
	admin := cluster.Client(t)
	m, proxy := newMutexThroughProxy(t, name)
	octx, err := m.Lock(ctx)
	require.NoError(t, err)

	proxy.Blackhole()
	uctx, cancel := context.WithTimeout(octx, 500*time.Millisecond)
	err = m.Unlock(uctx)
	cancel()
	require.Error(t, err)
	assert.NotErrorIs(t, err, reentrant.ErrLost)
	assert.NotErrorIs(t, err, reentrant.ErrNotLocked)
	assert.Equal(t, 1, m.Count(octx), "the count of a hold that could not be released")
	assert.NoError(t, octx.Err())
	assert.Len(t, keysOf(t, admin, name), 1)

	proxy.Restore()
	unlockUntilThrough(t, ctx, m, octx)
	assert.Zero(t, m.Count(octx))
	assert.Empty(t, keysOf(t, admin, name))
}

// TestALockDuringTheLastUnlockWaitsForItsOutcome re-enters while the last Unlock's release
// is under way and cannot reach etcd: the Lock waits, and counts up the hold that the
// failed release left, rather than report it gone.
func TestALockDuringTheLastUnlockWaitsForItsOutcome(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "lock-during-unlock"
	admin := cluster.Client(t)
	m, proxy := newMutexThroughProxy(t, name)
	octx, err := m.Lock(ctx)
	require.NoError(t, err)

	proxy.Blackhole()
	unlocked := make(chan error, 1)
	go func() {
		uctx, cancel := context.WithTimeout(octx, time.Second)
		defer cancel()
		unlocked <- m.Unlock(uctx)
	}()
	for m.Count(octx) != 0 { // the release has begun: no event tells, and it takes a second
		require.NoError(t, ctx.Err())
		runtime.Gosched()
	}
	_, err = m.Lock(octx)
	require.NoError(t, err, "a Lock during a release that failed")
	assert.Error(t, etcdtest.Within(t, unlocked, 10*time.Second, "the cut-off Unlock returns"))
	assert.Equal(t, 2, m.Count(octx))

	proxy.Restore()
	require.NoError(t, m.Unlock(octx))
	unlockUntilThrough(t, ctx, m, octx)
	assert.Empty(t, keysOf(t, admin, name))
}

// newMutexThroughProxy returns a Mutex on name whose client reaches etcd through a proxy
// that the test can black-hole.
func newMutexThroughProxy(t *testing.T, name string) (*reentrant.Mutex, *etcdtest.Proxy) {
	t.Helper()
	cli, proxy := etcdtest.ProxiedClient(t, cluster, 0)
	return newMutex(t, cli, name), proxy
}

// unlockUntilThrough calls Unlock until it succeeds: after a black hole, the client's
// connection may fail a few requests before it is replaced.
func unlockUntilThrough(t *testing.T, ctx context.Context, m *reentrant.Mutex, octx context.Context) {
	t.Helper()
	for {
		uctx, cancel := context.WithTimeout(octx, 2*time.Second)
		err := m.Unlock(uctx)
		cancel()
		if err == nil {
			return
		}
		require.NotErrorIs(t, err, reentrant.ErrNotLocked, "the retried Unlock found no hold")
		require.NoError(t, ctx.Err(), "the retried Unlock never got through: %v", err)
	}
}

// TestAFailedLastUnlockIsNeverCreditedWithALaterDelete: the last Unlock is refused by etcd,
// so the hold stays (count 1); an operator then deletes the key. That is a loss: the owning
// context ends with ErrLost and the next Unlock says so, not nil as if the failed Unlock had
// deleted it.
func TestAFailedLastUnlockIsNeverCreditedWithALaterDelete(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "failed-unlock"
	admin := cluster.Client(t)
	inj := &etcdtest.Injector{}
	m := newMutex(t, inj.Client(t, cluster), name)
	octx, err := m.Lock(ctx)
	require.NoError(t, err)

	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(name + "/"), Action: etcdtest.Refuse, Times: 1})
	require.Error(t, m.Unlock(octx))
	require.Equal(t, 1, m.Count(octx), "a refused last Unlock keeps the hold")
	require.NoError(t, octx.Err())

	_, err = admin.Delete(ctx, name+"/", clientv3.WithPrefix())
	require.NoError(t, err)
	etcdtest.Within(t, octx.Done(), 10*time.Second, "the owning context once the key is deleted")
	assert.ErrorIs(t, context.Cause(octx), reentrant.ErrLost)
	assert.ErrorIs(t, m.Unlock(octx), reentrant.ErrLost, "a loss reported as a release")
}
