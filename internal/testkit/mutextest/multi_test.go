package mutex_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	mt "github.com/etcdsync/etcdsync/internal/testkit/metrictest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/trylock"
)

// multiWithin bounds what should happen at once, on a busy machine.
const multiWithin = 20 * time.Second

func newMulti(tb testing.TB, cli *clientv3.Client, names []string, opts ...mutex.Option) *mutex.Multi {
	tb.Helper()
	m, err := mutex.NewMulti(cli, names, opts...)
	require.NoError(tb, err)
	return m
}

// TestMultiWritesOneKeyPerNameInOneTxn: Lock is one Txn that writes a key under every
// name, all at one create revision, the token; Unlock is one Txn that removes them all.
func TestMultiWritesOneKeyPerNameInOneTxn(t *testing.T) {
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	m := newMulti(t, cli, []string{"one-txn/c", "one-txn/a", "one-txn/b", "one-txn/a"})
	assert.Equal(t, []string{"one-txn/a", "one-txn/b", "one-txn/c"}, m.Names())
	require.NoError(t, m.TryLock(ctx)) // grants the lease: the Lock below counts alone
	require.NoError(t, m.Unlock(ctx))

	lctx := rpcstat.WithLabel(ctx, "lock")
	require.NoError(t, m.Lock(lctx))
	assert.Equal(t, int64(1), cnt.Labelled("lock")["Txn"], "Lock sent more than one Txn")
	keys := m.Keys()
	require.Len(t, keys, 3)
	admin := cluster.Client(t)
	for i, name := range m.Names() {
		assert.True(t, strings.HasPrefix(keys[i], core.NamePrefix(name)), "key %s not under %s", keys[i], name)
		resp, err := admin.Get(ctx, keys[i])
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		assert.Equal(t, m.Token(), resp.Kvs[0].CreateRevision, "keys at different revisions")
	}
	txn, err := admin.Txn(ctx).If(m.IsOwner()...).Commit()
	require.NoError(t, err)
	assert.True(t, txn.Succeeded, "IsOwner fails while held")

	uctx := rpcstat.WithLabel(ctx, "unlock")
	require.NoError(t, m.Unlock(uctx))
	assert.Equal(t, int64(1), cnt.Labelled("unlock")["Txn"], "Unlock sent more than one Txn")
	for _, name := range m.Names() {
		assert.Zero(t, primtest.Keys(t, admin, name), "Unlock left a key of %s", name)
	}
	assert.Zero(t, m.Token())
	assert.ErrorIs(t, m.Err(), mutex.ErrNotLocked)
}

// TestNewMultiRefusesBadInput: no name, too many, a bad name, a nil client: a clear error
// from NewMulti, which does no I/O.
func TestNewMultiRefusesBadInput(t *testing.T) {
	cli := cluster.Client(t)
	many := make([]string, mutex.MaxNames+1)
	for i := range many {
		many[i] = fmt.Sprint("n", i)
	}
	for _, tc := range []struct {
		what  string
		cli   *clientv3.Client
		names []string
		want  error
	}{
		{"no name", cli, nil, mutex.ErrInvalidOption},
		{"65 names", cli, many, mutex.ErrInvalidOption},
		{"an empty name", cli, []string{"a", ""}, mutex.ErrInvalidName},
		{"a NUL", cli, []string{"a", "b\x00"}, mutex.ErrInvalidName},
		{"nil client", nil, []string{"a"}, mutex.ErrInvalidOption},
	} {
		_, err := mutex.NewMulti(tc.cli, tc.names)
		assert.ErrorIs(t, err, tc.want, tc.what)
	}
	// 65 names with one repeated are 64 distinct ones.
	_, err := mutex.NewMulti(cli, append(many[:mutex.MaxNames], many[0]))
	assert.NoError(t, err)
}

// TestMultiOfTheLongestNamesFitsEtcdsDefaultLimits: 64 names of 512 bytes, each byte
// escaped to three, under a 512-byte prefix, are taken, queued behind, tried and released
// against etcd's default --max-txn-ops and --max-request-bytes.
func TestMultiOfTheLongestNamesFitsEtcdsDefaultLimits(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	prefix := strings.Repeat("p", core.MaxNameLen-1) + "/"
	names := make([]string, mutex.MaxNames)
	for i := range names {
		names[i] = fmt.Sprintf("%02d", i) + strings.Repeat("/", core.MaxNameLen-2)
	}
	a := newMulti(t, cli, names, mutex.WithPrefix(prefix))
	b := newMulti(t, cluster.Client(t), names, mutex.WithPrefix(prefix)) // another client, under the run's namespace on an external cluster
	require.NoError(t, a.Lock(ctx))
	assert.ErrorIs(t, b.TryLock(ctx), mutex.ErrLocked)
	waited := etcdtest.Async(func() error { return b.Lock(ctx) })
	etcdtest.AwaitKeys(t, cli, prefix, 2*mutex.MaxNames)
	etcdtest.Pending(t, waited, "b locked while a held")
	require.NoError(t, a.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, waited, multiWithin, "b's Lock"))
	require.NoError(t, b.Unlock(ctx))
	assert.Zero(t, etcdtest.CountKeys(t, cli, prefix))
}

// TestMultiQueuesWithMutexesAndEtcdsMutex: the keys of a Multi are ordinary mutex keys. It
// waits behind a Mutex on one of its names, and etcd's concurrency.Mutex on another of its
// names, arriving later, waits behind it.
func TestMultiQueuesWithMutexesAndEtcdsMutex(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	single := newMutex(t, cluster.Client(t), "interop-b")
	require.NoError(t, single.Lock(ctx))
	m := newMulti(t, cluster.Client(t), []string{"interop-a", "interop-b"})
	locked := etcdtest.Async(func() error { return m.Lock(ctx) })
	primtest.AwaitKeys(t, admin, "interop-a", 1)
	etcdtest.Pending(t, locked, "Multi locked while a Mutex held one of its names")

	sess, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer sess.Close()
	theirs := concurrency.NewMutex(sess, "interop-a")
	theirsLocked := etcdtest.Async(func() error { return theirs.Lock(ctx) })
	primtest.AwaitKeys(t, admin, "interop-a", 2)

	require.NoError(t, single.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, multiWithin, "Multi's Lock"))
	etcdtest.Pending(t, theirsLocked, "etcd's Mutex locked while the Multi held its name")
	require.NoError(t, m.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, theirsLocked, multiWithin, "etcd's Lock"))
	require.NoError(t, theirs.Unlock(ctx))
}

// TestMultiTryLockWritesNothingWhenANameIsTaken: a try on names of which one is held fails
// with ErrLocked, in one Txn that writes nothing.
func TestMultiTryLockWritesNothingWhenANameIsTaken(t *testing.T) {
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	single := newMutex(t, cluster.Client(t), "try-multi-c")
	require.NoError(t, single.Lock(ctx))
	m := newMulti(t, cli, []string{"try-multi-a", "try-multi-b", "try-multi-c"})
	lease := newMutex(t, cli, "try-multi-lease", core.WithoutTelemetry())
	require.NoError(t, lease.TryLock(ctx)) // the lease
	defer func() { require.NoError(t, lease.Unlock(ctx)) }()

	before := etcdtest.Revision(t, cluster.Client(t))
	tctx := rpcstat.WithLabel(ctx, "try")
	assert.ErrorIs(t, m.TryLock(tctx), mutex.ErrLocked)
	assert.Equal(t, rpcstat.Counts{"Txn": 1}, cnt.Labelled("try"))
	etcdtest.NoWrites(t, cluster.Client(t), before, "a failed TryLock wrote")
	assert.Nil(t, m.Keys())

	require.NoError(t, single.Unlock(ctx))
	require.NoError(t, m.TryLock(ctx))
	require.NoError(t, m.Unlock(ctx))
}

// TestRetryOverAMultiWakesWhenAnyNameIsReleased: trylock.Retry over a Multi, with a backoff
// far longer than the test, takes the names soon after the holder of any one of them lets
// go: its WatchRelease woke it.
func TestRetryOverAMultiWakesWhenAnyNameIsReleased(t *testing.T) {
	for i, held := range []string{"first", "middle", "last"} {
		t.Run(held, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			names := []string{"wake-multi-" + held + "-a", "wake-multi-" + held + "-b", "wake-multi-" + held + "-c"}
			holder := newMutex(t, cluster.Client(t), names[i])
			require.NoError(t, holder.Lock(ctx))
			m := &triedMulti{newMulti(t, cluster.Client(t), names), make(chan error, 100)}
			// Each wait of Retry is at least 30 s unless a release ends it.
			retried := etcdtest.Async(func() error { return trylock.Retry(ctx, m, trylock.Backoff(time.Minute, time.Minute)) })
			require.ErrorIs(t, etcdtest.Within(t, m.tried, multiWithin, "the first try"), mutex.ErrLocked)
			require.NoError(t, holder.Unlock(ctx))
			require.NoError(t, etcdtest.Within(t, retried, multiWithin, "Retry after the release"))
			assert.NotZero(t, m.Token())
			require.NoError(t, m.Unlock(ctx))
		})
	}
}

// triedMulti is a Multi whose tries are reported on tried.
type triedMulti struct {
	*mutex.Multi
	tried chan error
}

func (m *triedMulti) TryLock(ctx context.Context) error {
	err := m.Multi.TryLock(ctx)
	m.tried <- err
	return err
}

// TestCancelledMultiLockLeavesNoKey: a Lock that waits behind a holder of one name and is
// cancelled removes the keys it wrote under every name.
func TestCancelledMultiLockLeavesNoKey(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	single := newMutex(t, cluster.Client(t), "cancel-multi-b")
	require.NoError(t, single.Lock(ctx))
	m := newMulti(t, cluster.Client(t), []string{"cancel-multi-a", "cancel-multi-b"})
	lctx, cancel := context.WithCancel(ctx)
	locked := etcdtest.Async(func() error { return m.Lock(lctx) })
	primtest.AwaitKeys(t, admin, "cancel-multi-a", 1)
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, locked, multiWithin, "cancelled Lock"), context.Canceled)
	assert.Zero(t, primtest.Keys(t, admin, "cancel-multi-a"))
	assert.Equal(t, int64(1), primtest.Keys(t, admin, "cancel-multi-b"))
	assert.Nil(t, m.Keys())
	require.NoError(t, single.Unlock(ctx))
}

// TestLossOfOneKeyIsTheLossOfTheMulti: when one key goes, Done closes and Err is ErrLost;
// the write fenced by IsOwner fails; Unlock says ErrLost and removes the keys left.
func TestLossOfOneKeyIsTheLossOfTheMulti(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	m := newMulti(t, cluster.Client(t), []string{"loss-multi-a", "loss-multi-b", "loss-multi-c"})
	require.NoError(t, m.Lock(ctx))
	done := m.Done()
	_, err := admin.Delete(ctx, m.Keys()[1])
	require.NoError(t, err)
	etcdtest.Within(t, done, multiWithin, "Done after the loss of one key")
	assert.ErrorIs(t, m.Err(), mutex.ErrLost)
	txn, err := admin.Txn(ctx).If(m.IsOwner()...).Then(clientv3.OpPut("loss-multi-data", "x")).Commit()
	require.NoError(t, err)
	assert.False(t, txn.Succeeded, "a fenced write succeeded after a loss")
	assert.Equal(t, int64(1), primtest.Keys(t, admin, "loss-multi-a"), "a key left before Unlock went")
	assert.ErrorIs(t, m.Unlock(ctx), mutex.ErrLost)
	for _, name := range m.Names() {
		assert.Zero(t, primtest.Keys(t, admin, name), "Unlock left a key of %s", name)
	}
	require.NoError(t, m.Lock(ctx), "the handle is free again after Unlock")
	require.NoError(t, m.Unlock(ctx))
}

// TestMultiDoEndsTheWorkOnTheLossOfAnyKey: fn's ctx ends when one key goes, with ErrLost
// as its cause, and Do says ErrLost.
func TestMultiDoEndsTheWorkOnTheLossOfAnyKey(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	m := newMulti(t, cluster.Client(t), []string{"do-multi-a", "do-multi-b"})
	err := m.Do(ctx, func(fctx context.Context) error {
		// The delete on the test's ctx: fn's ends with the loss, which the hold's watch can
		// see before the delete's answer arrives.
		_, err := admin.Delete(ctx, m.Keys()[0])
		require.NoError(t, err)
		etcdtest.Within(t, fctx.Done(), multiWithin, "fn's ctx after a loss")
		assert.ErrorIs(t, context.Cause(fctx), mutex.ErrLost)
		return nil
	})
	assert.ErrorIs(t, err, mutex.ErrLost)
	assert.Zero(t, primtest.Keys(t, admin, "do-multi-b"))
}

// TestMultiLockWhoseAnswerNeverComesLeavesNoKey: the Lock's Txn is applied but its answer
// never comes, and ctx ends meanwhile: the Lock returns ctx's error having removed the keys
// it could not know it wrote, under every name.
func TestMultiLockWhoseAnswerNeverComesLeavesNoKey(t *testing.T) {
	t.Parallel()
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	names := []string{"dropped-multi-a", "dropped-multi-b"}
	inj := &etcdtest.Injector{}
	m := newMulti(t, inj.Client(t, cluster), names)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(names[0])), Action: etcdtest.Drop, Times: 1})
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, m.Lock(lctx), context.DeadlineExceeded)
	for _, name := range names {
		primtest.AwaitKeys(t, admin, name, 0)
	}
	require.NoError(t, m.Lock(ctx), "the handle is free after the failed Lock")
	require.NoError(t, m.Unlock(ctx))
}

// TestMultiLockWhoseTxnLandsLateLeavesNoKey: every try of the Lock's Txn reaches etcd only
// after the Lock gave up. The Lock retired its session, whose lease is revoked once no slot
// is claimed on it: a late try is refused, or its keys go with the lease.
func TestMultiLockWhoseTxnLandsLateLeavesNoKey(t *testing.T) {
	t.Parallel()
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	names := []string{"late-multi-a", "late-multi-b"}
	inj := &etcdtest.Injector{}
	m := newMulti(t, inj.Client(t, cluster), names)
	// Every try is answered "unavailable" at once and sent a second later.
	remove := inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(names[0])), Action: etcdtest.Late,
		Delay: time.Second})
	lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, m.Lock(lctx), context.DeadlineExceeded)
	remove()
	inj.Settle() // every late try has reached etcd: refused on the retired lease, or applied and gone with it
	for _, name := range names {
		primtest.AwaitKeys(t, admin, name, 0)
	}
	require.NoError(t, m.Lock(ctx), "the handle is free after the failed Lock")
	require.NoError(t, m.Unlock(ctx))
}

// TestMultiMetricsCountOneHoldOfPrimitiveMultiAndItsLoss: a Multi's acquisitions, its hold
// and its loss are measured as one, under etcdsync.primitive mutex.multi; the loss of one
// key counts one lost hold, deleted.
func TestMultiMetricsCountOneHoldOfPrimitiveMultiAndItsLoss(t *testing.T) {
	ctx := etcdtest.Context(t)
	r := mt.NewReader(t)
	prim := mt.Primitive.String("mutex.multi")
	names := []string{"metrics-multi-a", "metrics-multi-b", "metrics-multi-c"}
	m := newMulti(t, cluster.Client(t), names, mutex.WithMeterProvider(r.Provider))
	other := newMulti(t, cluster.Client(t), names[1:], mutex.WithMeterProvider(r.Provider))

	require.NoError(t, m.Lock(ctx))
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Holds, prim), "one hold of three names")
	require.ErrorIs(t, other.TryLock(ctx), mutex.ErrLocked)
	require.NoError(t, m.Unlock(ctx))

	require.NoError(t, m.Lock(ctx))
	done := m.Done()
	_, err := cluster.Client(t).Delete(ctx, m.Keys()[2])
	require.NoError(t, err)
	etcdtest.Within(t, done, multiWithin, "Done after a key was deleted")
	require.ErrorIs(t, m.Unlock(ctx), mutex.ErrLost)

	d := r.Collect(t)
	assert.EqualValues(t, 2, d.Count(mt.AcquireDuration, prim, acquired))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, busy))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, released))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, lost))
	assert.EqualValues(t, 1, d.Sum(mt.HoldLost, prim, mt.Cause.String("deleted")))
	assert.EqualValues(t, 0, d.Sum(mt.Holds, prim), "holds back to zero")
	assert.EqualValues(t, 0, d.Sum(mt.Holds, primMutex), "no hold counted as a mutex")
}

// TestMaxNamesIsEtcdsDefaultTxnLimit: a Txn as a Multi of one name more than MaxNames would
// send (a count and a put per name) is refused by etcd's default --max-txn-ops, so MaxNames
// is the most that fits.
func TestMaxNamesIsEtcdsDefaultTxnLimit(t *testing.T) {
	ctx := etcdtest.Context(t)
	ops := func(n int) []clientv3.Op {
		var ops []clientv3.Op
		for i := range n {
			ops = append(ops, clientv3.OpGet(fmt.Sprintf("txn-limit-%d/", i), clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
		for i := range n {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("txn-limit-%d/k", i), ""))
		}
		return ops
	}
	_, err := cluster.Client(t).Txn(ctx).Then(ops(mutex.MaxNames + 1)...).Commit()
	require.ErrorIs(t, err, rpctypes.ErrTooManyOps)
	_, err = cluster.Client(t).Txn(ctx).Then(ops(mutex.MaxNames)...).Commit()
	require.NoError(t, err)
	_, err = cluster.Client(t).Delete(ctx, "txn-limit-", clientv3.WithPrefix())
	require.NoError(t, err)
}

// TestUnlockOfAMultiWhoseKeyWentUnwatchedSaysLost: a key deleted while nobody watched the
// hold (no Done, Err or Do) is found gone by Unlock's one Txn, which removes the others and
// says ErrLost.
func TestUnlockOfAMultiWhoseKeyWentUnwatchedSaysLost(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	m := newMulti(t, cluster.Client(t), []string{"unwatched-multi-a", "unwatched-multi-b"})
	require.NoError(t, m.Lock(ctx))
	_, err := admin.Delete(ctx, m.Keys()[0])
	require.NoError(t, err)
	assert.ErrorIs(t, m.Unlock(ctx), mutex.ErrLost)
	assert.Zero(t, primtest.Keys(t, admin, "unwatched-multi-b"), "Unlock left the other key")
}

// TestMultiLockWhoseFirstAnswerIsLostTakesItsKeysOver: the first try of the Lock's Txn is
// applied but its answer never comes; the retry, once the try's bound has passed, finds
// the keys written and holds with them, instead of failing while ctx has time.
func TestMultiLockWhoseFirstAnswerIsLostTakesItsKeysOver(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out one try's 5 s bound")
	}
	ctx := etcdtest.Context(t)
	names := []string{"retried-multi-a", "retried-multi-b"}
	inj := &etcdtest.Injector{}
	m := newMulti(t, inj.Client(t, cluster), names)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(names[0])), Action: etcdtest.Drop, Times: 1})
	require.NoError(t, m.Lock(ctx), "one try without an answer failed the Lock")
	admin := cluster.Client(t)
	for i, name := range names {
		resp, err := admin.Get(ctx, m.Keys()[i])
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1, name)
		assert.Equal(t, m.Token(), resp.Kvs[0].CreateRevision)
	}
	require.NoError(t, m.Unlock(ctx))
	for _, name := range names {
		assert.Zero(t, primtest.Keys(t, admin, name))
	}
}
