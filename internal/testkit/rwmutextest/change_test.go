package rwmutex_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

const served = 5 * time.Second

// dispatched runs change and returns once the client of each of rws has dispatched an event
// that came after it (a delete, or a change of a key's mode) to its waiters: what a wrong
// serve would be decided on.
func dispatched(t *testing.T, change func() error, rws ...*rwmutex.RWMutex) {
	t.Helper()
	var armed []<-chan struct{}
	for _, rw := range rws {
		arm, stop := rw.WatchRelease()
		defer stop()
		armed = append(armed, arm())
	}
	require.NoError(t, change())
	for _, ch := range armed {
		etcdtest.Within(t, ch, served, "the change reaching a waiter's client")
	}
}

// upgrading starts u's Upgrade and returns once its key is marked upgrading: readers that
// arrive from then on queue behind it.
func upgrading(t *testing.T, ctx context.Context, admin *clientv3.Client, u *rwmutex.RWMutex) <-chan error {
	t.Helper()
	upgraded := etcdtest.Async(func() error { return u.Upgrade(ctx) })
	require.Eventually(t, func() bool {
		v, _ := value(t, admin, u.Key())
		return strings.HasSuffix(v, " mode=upgrading")
	}, served, 10*time.Millisecond, "the key is upgrading")
	return upgraded
}

// waits asserts that the call errc stands for has no outcome: a wrong serve returns
// microseconds after its client dispatched the event, so the grace makes a miss unlikely
// and never fails a sound run.
func waits(t *testing.T, errc <-chan error, what string) {
	t.Helper()
	select {
	case err := <-errc:
		t.Fatalf("%s returned (%v) while it should wait", what, err)
	case <-time.After(200 * time.Millisecond):
	}
}

// value reads key's value and create revision.
func value(t *testing.T, cli *clientv3.Client, key string) (string, int64) {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "key %s", key)
	return string(resp.Kvs[0].Value), resp.Kvs[0].CreateRevision
}

// TestDowngradeLetsTheReadersAheadOfTheNextWriterIn: a writer's hold becomes a read in
// place (same key, same create revision): the reader queued behind it is served, the writer
// behind that waits for both, and the reader behind the writer waits for it, our own and
// etcd's recipe's alike.
func TestDowngradeLetsTheReadersAheadOfTheNextWriterIn(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "downgrade"
	admin := cluster.Client(t)
	w := newRW(t, cluster.Client(t), name)
	require.NoError(t, w.Lock(ctx))
	key, token := w.Key(), w.Token()

	r1 := newRW(t, cluster.Client(t), name)
	r1locked := etcdtest.Async(func() error { return r1.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	sess, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer sess.Close()
	theirs := recipe.NewRWMutex(sess, name)
	theirsLocked := etcdtest.Async(theirs.RLock)
	primtest.AwaitKeys(t, admin, name, 3)
	w2 := newRW(t, cluster.Client(t), name)
	w2locked := etcdtest.Async(func() error { return w2.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 4)
	r2 := newRW(t, cluster.Client(t), name)
	r2locked := etcdtest.Async(func() error { return r2.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 5)
	waits(t, r1locked, "RLock behind a write hold")

	dispatched(t, func() error { return w.Downgrade(ctx) }, w2, r2)
	assert.Equal(t, key, w.Key(), "the hold keeps its key")
	assert.Zero(t, w.Token(), "a read hold has no token")
	v, created := value(t, admin, key)
	assert.Equal(t, token, created, "the key keeps its create revision")
	assert.True(t, strings.HasSuffix(v, " mode=read"), "value %q", v)
	require.NoError(t, etcdtest.Within(t, r1locked, served, "RLock behind the downgraded hold"))
	waits(t, theirsLocked, "recipe's RLock takes the downgraded hold for a writer")
	waits(t, w2locked, "Lock behind the downgraded hold")
	waits(t, r2locked, "RLock behind the waiting writer")
	assert.Equal(t, int64(5), primtest.Keys(t, admin, name))

	dispatched(t, func() error { return w.RUnlock(ctx) }, w2)
	require.NoError(t, etcdtest.Within(t, theirsLocked, served, "recipe's RLock once the downgraded hold left"))
	waits(t, w2locked, "Lock behind the readers")
	require.NoError(t, r1.RUnlock(ctx))
	require.NoError(t, theirs.RUnlock())
	require.NoError(t, etcdtest.Within(t, w2locked, served, "Lock once the readers left"))
	assert.Greater(t, w2.Token(), token)
	waits(t, r2locked, "RLock behind the writer")
	require.NoError(t, w2.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, r2locked, served, "RLock after the writer"))
	require.NoError(t, r2.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestDowngradedHoldIsTheHandlesReadHold: the handle's own readers join the downgraded hold,
// its next Lock waits for them, and a TryRLock of another client gets in beside it while a
// TryLock does not; nothing is written by the refusals.
func TestDowngradedHoldIsTheHandlesReadHold(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "downgrade-joined"
	admin := cluster.Client(t)
	w := newRW(t, cluster.Client(t), name)
	require.NoError(t, w.Lock(ctx))
	require.NoError(t, w.Downgrade(ctx))
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return w.RLock(ctx) }), served, "a reader of the handle joins"))
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name), "joined: no key of its own")

	other := newRW(t, cluster.Client(t), name)
	rev := etcdtest.Revision(t, admin)
	assert.ErrorIs(t, other.TryLock(ctx), rwmutex.ErrLocked)
	etcdtest.NoWrites(t, admin, rev, "a refused TryLock")
	require.NoError(t, other.TryRLock(ctx), "TryRLock beside a downgraded hold")
	require.NoError(t, other.RUnlock(ctx))

	locked := etcdtest.Async(func() error { return w.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	require.NoError(t, w.RUnlock(ctx))
	waits(t, locked, "Lock with a reader of the downgraded hold left")
	require.NoError(t, w.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, served, "Lock once the downgraded hold left"))
	assert.ErrorIs(t, w.RUnlock(ctx), rwmutex.ErrNotLocked)
	require.NoError(t, w.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestUpgradableReadIsBesideReadersAndNeverBesideWriters: one upgradable read at a time per
// name, served beside readers that came before and after it, not beside a writer; a second
// one waits for it, a try of one is refused without a write.
func TestUpgradableReadIsBesideReadersAndNeverBesideWriters(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "upgradable"
	admin := cluster.Client(t)
	r1 := newRW(t, cluster.Client(t), name)
	require.NoError(t, r1.RLock(ctx))
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return u.ULock(ctx) }), served, "ULock beside a reader"))
	assert.Zero(t, u.Token(), "an upgradable read has no token")
	v, _ := value(t, admin, u.Key())
	assert.True(t, strings.HasSuffix(v, " mode=upgradable"), "value %q", v)
	assert.True(t, strings.Contains(u.Key(), "/write/"), "an upgradable read's key is a write key: %s", u.Key())

	r2 := newRW(t, cluster.Client(t), name)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return r2.RLock(ctx) }), served, "RLock beside the upgradable read"))
	r3 := newRW(t, cluster.Client(t), name)
	require.NoError(t, r3.TryRLock(ctx), "TryRLock beside the upgradable read")
	require.NoError(t, r3.RUnlock(ctx))

	other := newRW(t, cluster.Client(t), name)
	rev := etcdtest.Revision(t, admin)
	assert.ErrorIs(t, other.TryULock(ctx), rwmutex.ErrLocked)
	assert.ErrorIs(t, other.TryLock(ctx), rwmutex.ErrLocked)
	etcdtest.NoWrites(t, admin, rev, "refused tries")
	u2locked := etcdtest.Async(func() error { return other.ULock(ctx) })
	primtest.AwaitKeys(t, admin, name, 4)
	w := newRW(t, cluster.Client(t), name)
	wlocked := etcdtest.Async(func() error { return w.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 5)
	waits(t, u2locked, "a second ULock")
	waits(t, wlocked, "Lock behind two upgradable reads")

	dispatched(t, func() error { return u.UUnlock(ctx) }, w)
	require.NoError(t, etcdtest.Within(t, u2locked, served, "the second ULock once the first left"))
	waits(t, wlocked, "Lock behind an upgradable read")
	dispatched(t, func() error { return other.UUnlock(ctx) }, w)
	waits(t, wlocked, "Lock behind readers")
	require.NoError(t, r1.RUnlock(ctx))
	require.NoError(t, r2.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, wlocked, served, "Lock once all left"))
	require.NoError(t, w.Unlock(ctx))
	assert.ErrorIs(t, u.UUnlock(ctx), rwmutex.ErrNotLocked)
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestUpgradeWaitsForTheReadersAdmittedBeforeIt: Upgrade waits for the reader before the
// upgradable read and the one admitted after it, not for a reader queued behind a writer
// that waits for the upgrade (a deadlock otherwise); readers arriving once it started wait
// behind it. Once upgraded it fences as a writer, and releases with Unlock.
func TestUpgradeWaitsForTheReadersAdmittedBeforeIt(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "upgrade"
	admin := cluster.Client(t)
	r1 := newRW(t, cluster.Client(t), name)
	require.NoError(t, r1.RLock(ctx))
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, u.ULock(ctx))
	r2 := newRW(t, cluster.Client(t), name)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return r2.RLock(ctx) }), served, "RLock beside the upgradable read"))
	w := newRW(t, cluster.Client(t), name)
	wlocked := etcdtest.Async(func() error { return w.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 4)
	r3 := newRW(t, cluster.Client(t), name)
	r3locked := etcdtest.Async(func() error { return r3.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 5)

	upgraded := upgrading(t, ctx, admin, u)
	r4 := newRW(t, cluster.Client(t), name)
	r4locked := etcdtest.Async(func() error { return r4.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 6)
	waits(t, upgraded, "Upgrade with two readers admitted")
	waits(t, r4locked, "RLock that came during the Upgrade")
	dispatched(t, func() error { return r1.RUnlock(ctx) }, u)
	waits(t, upgraded, "Upgrade with a reader admitted after it")
	require.NoError(t, r2.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, upgraded, served, "Upgrade once the admitted readers left"))
	_, created := value(t, admin, u.Key())
	assert.Equal(t, created, u.Token(), "the token is the key's create revision")
	resp, err := admin.Txn(ctx).If(u.IsOwner()).Commit()
	require.NoError(t, err)
	assert.True(t, resp.Succeeded, "IsOwner of the upgraded hold")
	waits(t, r4locked, "RLock that came during the Upgrade")
	waits(t, wlocked, "Lock behind the upgraded hold")

	require.NoError(t, u.Unlock(ctx), "Unlock releases an upgraded hold")
	require.NoError(t, etcdtest.Within(t, wlocked, served, "Lock after the upgraded hold"))
	assert.Greater(t, w.Token(), created)
	waits(t, r3locked, "RLock behind the writer")
	waits(t, r4locked, "RLock behind the writer")
	require.NoError(t, w.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, r3locked, served, "RLock after the writer"))
	require.NoError(t, etcdtest.Within(t, r4locked, served, "RLock after the writer"))
	require.NoError(t, r3.RUnlock(ctx))
	require.NoError(t, r4.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestUpgradeGivenUpIsAnUpgradableReadAgain: an Upgrade whose ctx ends before the readers
// leave puts the upgradable mode back, so readers get in again; a later Upgrade works.
func TestUpgradeGivenUpIsAnUpgradableReadAgain(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "upgrade-given-up"
	admin := cluster.Client(t)
	r := newRW(t, cluster.Client(t), name)
	require.NoError(t, r.RLock(ctx))
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, u.ULock(ctx))
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, u.Upgrade(short), context.DeadlineExceeded)
	assert.Zero(t, u.Token())
	v, _ := value(t, admin, u.Key())
	assert.True(t, strings.HasSuffix(v, " mode=upgradable"), "value %q", v)
	r2 := newRW(t, cluster.Client(t), name)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return r2.RLock(ctx) }), served, "RLock beside the upgradable read again"))

	upgraded := etcdtest.Async(func() error { return u.Upgrade(ctx) })
	dispatched(t, func() error { return r.RUnlock(ctx) }, u)
	waits(t, upgraded, "Upgrade with a reader left")
	require.NoError(t, r2.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, upgraded, served, "Upgrade once the readers left"))
	assert.NotZero(t, u.Token())
	require.NoError(t, u.Downgrade(ctx), "an upgraded hold downgrades")
	assert.Zero(t, u.Token())
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return r2.RLock(ctx) }), served, "RLock beside the downgraded hold"))
	require.NoError(t, r2.RUnlock(ctx))
	assert.ErrorIs(t, u.UUnlock(ctx), rwmutex.ErrNotLocked, "the upgradable read is a read now")
	require.NoError(t, u.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestUpgradeOfALostHoldSaysSo: the upgradable read's lease revoked while Upgrade waits
// for a reader: Upgrade returns ErrLost, and so does UUnlock.
func TestUpgradeOfALostHoldSaysSo(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "upgrade-lost"
	admin := cluster.Client(t)
	r := newRW(t, cluster.Client(t), name)
	require.NoError(t, r.RLock(ctx))
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, u.ULock(ctx))
	upgraded := upgrading(t, ctx, admin, u)
	resp, err := admin.Get(ctx, u.Key())
	require.NoError(t, err)
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	assert.ErrorIs(t, etcdtest.Within(t, upgraded, served, "Upgrade of a lost hold"), rwmutex.ErrLost)
	assert.Zero(t, u.Token())
	assert.ErrorIs(t, u.UUnlock(ctx), rwmutex.ErrLost)
	assert.ErrorIs(t, u.UUnlock(ctx), rwmutex.ErrNotLocked)
	require.NoError(t, r.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestChangesWithoutAHold: each change without the hold it changes says ErrNotLocked and
// writes nothing.
func TestChangesWithoutAHold(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "no-change"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	rev := etcdtest.Revision(t, admin)
	assert.ErrorIs(t, rw.Downgrade(ctx), rwmutex.ErrNotLocked)
	assert.ErrorIs(t, rw.Upgrade(ctx), rwmutex.ErrNotLocked)
	assert.ErrorIs(t, rw.UUnlock(ctx), rwmutex.ErrNotLocked)
	etcdtest.NoWrites(t, admin, rev, "changes without a hold")
	require.NoError(t, rw.RLock(ctx))
	rev = etcdtest.Revision(t, admin)
	assert.ErrorIs(t, rw.Downgrade(ctx), rwmutex.ErrNotLocked, "a read hold does not downgrade")
	assert.ErrorIs(t, rw.Upgrade(ctx), rwmutex.ErrNotLocked, "a plain read does not upgrade")
	etcdtest.NoWrites(t, admin, rev, "changes of a read hold")
	require.NoError(t, rw.RUnlock(ctx))
}

// TestDowngradeInsideDo: Do leaves the read hold its write hold became; fn's ctx lasts
// through the downgrade, and a reader behind it is served while fn still runs.
func TestDowngradeInsideDo(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "downgrade-do"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	r := newRW(t, cluster.Client(t), name)
	err := rw.Do(ctx, func(fctx context.Context) error {
		rlocked := etcdtest.Async(func() error { return r.RLock(ctx) })
		primtest.AwaitKeys(t, admin, name, 2)
		if err := rw.Downgrade(fctx); err != nil {
			return err
		}
		require.NoError(t, etcdtest.Within(t, rlocked, served, "RLock behind the downgraded hold"))
		return fctx.Err()
	})
	require.NoError(t, err)
	assert.ErrorIs(t, rw.RUnlock(ctx), rwmutex.ErrNotLocked, "Do left the read hold")
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name))
	require.NoError(t, r.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestUpgradeWaitsForAReaderThatAWithdrawnWriterLetIn: a reader queued behind a writer that
// waits for the upgrade is not waited for; once that writer gives up, the reader, which came
// before the upgrade began, is served beside it, and the upgrade waits for it too.
func TestUpgradeWaitsForAReaderThatAWithdrawnWriterLetIn(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "upgrade-withdrawn"
	admin := cluster.Client(t)
	r1 := newRW(t, cluster.Client(t), name)
	require.NoError(t, r1.RLock(ctx))
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, u.ULock(ctx))
	w := newRW(t, cluster.Client(t), name)
	wctx, withdraw := context.WithCancel(ctx)
	defer withdraw()
	wlocked := etcdtest.Async(func() error { return w.Lock(wctx) })
	primtest.AwaitKeys(t, admin, name, 3)
	r2 := newRW(t, cluster.Client(t), name)
	r2locked := etcdtest.Async(func() error { return r2.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 4)

	upgraded := upgrading(t, ctx, admin, u)
	waits(t, r2locked, "RLock behind a writer")
	withdraw()
	assert.ErrorIs(t, etcdtest.Within(t, wlocked, served, "the withdrawn Lock"), context.Canceled)
	require.NoError(t, etcdtest.Within(t, r2locked, served, "RLock that came before the upgrade, its writer gone"))
	dispatched(t, func() error { return r1.RUnlock(ctx) }, u)
	waits(t, upgraded, "Upgrade with the reader let in")
	require.NoError(t, r2.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, upgraded, served, "Upgrade once both readers left"))
	require.NoError(t, u.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestAFarReaderHearsAChangeOfTheKeyItWatches: a reader far back (two writers ahead, with
// one key ahead enough to be near) approaches: it watches the first writer's key alone.
// That writer downgrades, and the second writer, which kept the reader out, gives up: the
// reader is served beside the downgraded hold, as it would be had it never approached.
func TestAFarReaderHearsAChangeOfTheKeyItWatches(t *testing.T) {
	defer core.SetNearAhead(1)()
	ctx := etcdtest.Context(t)
	const name = "far-reader"
	admin := cluster.Client(t)
	w1 := newRW(t, cluster.Client(t), name)
	require.NoError(t, w1.Lock(ctx))
	w2 := newRW(t, cluster.Client(t), name)
	wctx, withdraw := context.WithCancel(ctx)
	defer withdraw()
	w2locked := etcdtest.Async(func() error { return w2.Lock(wctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	rcli := cluster.Client(t)
	r := newRW(t, rcli, name)
	rlocked := etcdtest.Async(func() error { return r.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 3)
	waits(t, rlocked, "RLock behind two writers")
	assert.False(t, core.HasHub(rcli, name), "the far reader joined its client's watch of the name")

	require.NoError(t, w1.Downgrade(ctx))
	waits(t, rlocked, "RLock behind a writer")
	withdraw()
	assert.ErrorIs(t, etcdtest.Within(t, w2locked, served, "the withdrawn Lock"), context.Canceled)
	require.NoError(t, etcdtest.Within(t, rlocked, served, "RLock beside the downgraded hold"))
	require.NoError(t, r.RUnlock(ctx))
	require.NoError(t, w1.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}
