package reentrant_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
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
	"github.com/etcdsync/etcdsync/reentrant"
)

func TestReentryCountsUpWithoutRPCsAndTheLastUnlockReleases(t *testing.T) {
	// The test's calls are labelled, and the hold's key tracked: the counts leave out what
	// the client sends meanwhile in the background (the hold's watch, lease renewals).
	ctx := rpcstat.WithLabel(etcdtest.Context(t), "test")
	const name, depth = "reentry", 5
	admin := cluster.Client(t)
	cnt := &rpcstat.Counter{}
	m := newMutex(t, primtest.CountedClient(t, cluster, cnt), name)

	octx, err := m.Lock(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, m.Count(octx))
	assert.Zero(t, m.Count(ctx), "the caller's own context owns the hold")
	token := m.Token()
	require.NotZero(t, token)
	key := cluster.Prefix() + m.Key()
	cnt.Track(key)

	before, rev := cnt.Labelled("test"), etcdtest.Revision(t, admin)
	for n := 2; n <= depth; n++ {
		lock := m.Lock
		if n == depth {
			lock = m.TryLock
		}
		again, err := lock(octx)
		require.NoError(t, err)
		assert.True(t, again == octx, "a re-entry returns the context it was given")
		assert.Equal(t, n, m.Count(octx))
	}
	assert.Empty(t, cnt.Labelled("test").Sub(before), "requests sent to re-enter")
	assert.Empty(t, requests(cnt.Under(key)), "requests on the hold's key sent to re-enter")
	etcdtest.NoWrites(t, admin, rev, "a re-entry wrote")
	assert.Equal(t, token, m.Token(), "a re-entry took a new hold")

	for n := depth - 1; n >= 1; n-- {
		require.NoError(t, m.Unlock(octx))
		assert.Equal(t, n, m.Count(octx))
		assert.Len(t, keysOf(t, admin, name), 1, "released with %d Locks to go", n)
		assert.NoError(t, octx.Err())
		assert.NoError(t, m.Err())
	}
	require.NoError(t, m.Unlock(octx))
	assert.Empty(t, keysOf(t, admin, name), "the last Unlock left the key")
	assert.Zero(t, m.Count(octx))
	assert.ErrorIs(t, octx.Err(), context.Canceled, "the owning context outlived the hold")
	assert.Equal(t, context.Canceled, context.Cause(octx))
	assert.NoError(t, ctx.Err(), "the caller's context was cancelled")
	assert.Zero(t, m.Token())
	assert.ErrorIs(t, m.Err(), reentrant.ErrNotLocked)

	// The released context owns nothing more, and does not queue for a new hold either.
	rev = etcdtest.Revision(t, admin)
	assert.ErrorIs(t, m.Unlock(octx), reentrant.ErrNotLocked)
	_, err = m.Lock(octx)
	assert.ErrorIs(t, err, context.Canceled)
	_, err = m.Lock(context.WithoutCancel(octx))
	assert.ErrorIs(t, err, reentrant.ErrNotLocked)
	etcdtest.NoWrites(t, admin, rev, "a call with the released context wrote")
}

func TestContextsDerivedFromTheOwningOneReenter(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "derived"
	admin := cluster.Client(t)
	m := newMutex(t, cluster.Client(t), name)
	octx, err := m.Lock(ctx)
	require.NoError(t, err)

	type key struct{}
	cancelled, cancel := context.WithCancel(octx)
	defer cancel()
	timed, tcancel := context.WithTimeout(octx, time.Minute)
	defer tcancel()
	derived := []context.Context{context.WithValue(octx, key{}, 1), cancelled, timed, context.WithoutCancel(octx)}
	rev := etcdtest.Revision(t, admin)
	for i, d := range derived {
		again, err := m.Lock(d)
		require.NoError(t, err, "derived context %d", i)
		assert.True(t, again == d)
		assert.Equal(t, i+2, m.Count(d))
		assert.Equal(t, i+2, m.Count(octx), "a derived context counted apart")
	}
	etcdtest.NoWrites(t, admin, rev, "a re-entry wrote")
	for i, d := range derived { // any of them may unlock: they are one owner
		require.NoError(t, m.Unlock(d))
		assert.Equal(t, len(derived)-i, m.Count(octx))
	}
	assert.Len(t, keysOf(t, admin, name), 1)
	require.NoError(t, m.Unlock(octx))
	assert.Empty(t, keysOf(t, admin, name))
	assert.ErrorIs(t, cancelled.Err(), context.Canceled, "a derived context outlived the hold")
}

func TestGoroutinesSharingAnOwningContextReenterConcurrently(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, goroutines, rounds = "shared-owner", 8, 200
	admin := cluster.Client(t)
	m := newMutex(t, cluster.Client(t), name)
	octx, err := m.Lock(ctx)
	require.NoError(t, err)

	rev := etcdtest.Revision(t, admin)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				if _, err := m.Lock(octx); !assert.NoError(t, err) {
					return
				}
				assert.GreaterOrEqual(t, m.Count(octx), 2)
				assert.NoError(t, m.Unlock(octx))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 1, m.Count(octx))
	etcdtest.NoWrites(t, admin, rev, "a re-entry or a non-last Unlock wrote")
	assert.NoError(t, octx.Err())
	require.NoError(t, m.Unlock(octx))
	assert.Empty(t, keysOf(t, admin, name))
}

func TestOtherOwnersWaitAndAreServedInArrivalOrder(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "fifo"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	other := newMutex(t, cluster.Client(t), name)
	octx, err := holder.Lock(ctx)
	require.NoError(t, err)
	_, err = holder.Lock(octx)
	require.NoError(t, err)
	held := keysOf(t, admin, name)[0]

	// New owners: fresh contexts on the holder's own handle and on another one, in turns.
	waiters := []*reentrant.Mutex{holder, other, holder, other}
	var (
		mu       sync.Mutex
		order    []int
		released atomic.Bool
		wg       sync.WaitGroup
	)
	for i, m := range waiters {
		wg.Go(func() {
			wctx, err := m.Lock(ctx)
			if !assert.NoError(t, err) {
				return
			}
			assert.True(t, released.Load(), "waiter %d served while the first owner held", i)
			assert.Equal(t, 1, m.Count(wctx), "waiter %d re-entered another owner's hold", i)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			assert.NoError(t, m.Unlock(wctx))
		})
		primtest.AwaitKeys(t, admin, name, int64(i+2)) // waiter i is in line before i+1 starts
	}
	assert.Zero(t, holder.Count(ctx))

	require.NoError(t, holder.Unlock(octx))
	keys := keysOf(t, admin, name)
	require.Len(t, keys, 1+len(waiters), "a waiter left or the hold was released early")
	assert.Equal(t, held.Key, keys[0].Key)
	assert.Equal(t, held.CreateRevision, keys[0].CreateRevision)
	released.Store(true)
	require.NoError(t, holder.Unlock(octx))
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2, 3}, order)
	assert.Empty(t, keysOf(t, admin, name))
}

func TestUnlockByANonOwnerReturnsErrNotLockedAndWritesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "non-owner"
	admin := cluster.Client(t)
	cli := cluster.Client(t)
	m := newMutex(t, cli, name)
	octx, err := m.Lock(ctx)
	require.NoError(t, err)
	elsewhere := newMutex(t, cli, "non-owner-elsewhere")
	foreign, err := elsewhere.Lock(ctx)
	require.NoError(t, err)
	sameName := newMutex(t, cli, name)

	rev := etcdtest.Revision(t, admin)
	for _, tc := range []struct {
		desc string
		m    *reentrant.Mutex
		ctx  context.Context
	}{
		{"fresh context", m, ctx},
		{"context owning another Mutex", m, foreign},
		{"owning context on another handle of the name", sameName, octx},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			assert.ErrorIs(t, tc.m.Unlock(tc.ctx), reentrant.ErrNotLocked)
		})
	}
	etcdtest.NoWrites(t, admin, rev, "an Unlock by a non-owner wrote")
	assert.Equal(t, 1, m.Count(octx))
	assert.NoError(t, octx.Err())
	assert.NoError(t, m.Err())
	assert.ErrorIs(t, sameName.Err(), reentrant.ErrNotLocked)
	require.NoError(t, m.Unlock(octx))
	require.NoError(t, elsewhere.Unlock(foreign))
	assert.Empty(t, keysOf(t, admin, name))
}

// TestRecursiveJobsOfSeveralOwnersNeverOverlap runs recursive jobs on separate clients, each
// locking at every level with the context of the level above and making a fenced
// read-modify-write of one counter there. Two owners inside at once would show in the
// in-process count, and as increments lost in etcd.
func TestRecursiveJobsOfSeveralOwnersNeverOverlap(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, counter = "jobs", "jobs-data/counter"
	const jobs, rounds, depth = 4, 8, 3
	admin := cluster.Client(t)
	_, err := admin.Put(ctx, counter, "0")
	require.NoError(t, err)

	var inside atomic.Int64
	var wg sync.WaitGroup
	for range jobs {
		cli := cluster.Client(t)
		m := newMutex(t, cli, name)
		var level func(ctx context.Context, n int) error
		level = func(ctx context.Context, n int) error {
			lctx, err := m.Lock(ctx)
			if err != nil {
				return err
			}
			if n == 1 {
				assert.Equal(t, int64(1), inside.Add(1), "two owners inside at once")
			}
			assert.Equal(t, n, m.Count(lctx))
			err = fencedIncrement(lctx, cli, m, counter)
			if err == nil && n < depth {
				err = level(lctx, n+1)
			}
			if n == 1 {
				inside.Add(-1) // before the last Unlock lets the next owner in
			}
			return errors.Join(err, m.Unlock(lctx))
		}
		wg.Go(func() {
			for range rounds {
				if !assert.NoError(t, level(ctx, 1)) {
					return
				}
			}
		})
	}
	wg.Wait()
	resp, err := admin.Get(ctx, counter)
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(jobs*rounds*depth), string(resp.Kvs[0].Value), "increments lost")
	assert.Empty(t, keysOf(t, admin, name))
}

// fencedIncrement adds one to counter in a Txn that applies only while m's hold lasts.
func fencedIncrement(ctx context.Context, cli *clientv3.Client, m *reentrant.Mutex, counter string) error {
	resp, err := cli.Get(ctx, counter)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return err
	}
	txn, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(counter, strconv.Itoa(n+1))).Commit()
	if err != nil {
		return err
	}
	if !txn.Succeeded {
		return errors.New("the fenced increment was refused while the lock was held")
	}
	return nil
}

// TestACancelledLockReturnsTheContextItWasGiven: a new owner's Lock, on the holder's own
// handle or on another, that is cancelled or times out returns the context it was given,
// counts nothing and leaves no key. (The cancelled wait of every primitive: primtest's
// TestCancelledWaitReturnsContextErrorAndLeavesNoKey.)
func TestACancelledLockReturnsTheContextItWasGiven(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "cancel"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	octx, err := holder.Lock(ctx)
	require.NoError(t, err)

	for _, waiter := range []*reentrant.Mutex{holder, newMutex(t, cluster.Client(t), name)} {
		wctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			got, err := waiter.Lock(wctx)
			assert.True(t, got == wctx, "a failed Lock returns the context it was given")
			errc <- err
		}()
		primtest.AwaitKeys(t, admin, name, 2)
		cancel()
		assert.ErrorIs(t, etcdtest.Within(t, errc, 10*time.Second, "cancelled Lock returns"), context.Canceled)
		assert.Len(t, keysOf(t, admin, name), 1, "the cancelled waiter's key is left")
		assert.Zero(t, waiter.Count(wctx))

		dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		got, err := waiter.Lock(dctx)
		dcancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.True(t, got == dctx, "a failed Lock returns the context it was given")
		assert.Len(t, keysOf(t, admin, name), 1, "the timed-out waiter's key is left")
	}
	require.NoError(t, holder.Unlock(octx))
	assert.Empty(t, keysOf(t, admin, name))
}

func TestTryLockFailsAtOnceAndWritesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "try"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	octx, err := holder.TryLock(ctx)
	require.NoError(t, err)
	other := newMutex(t, cluster.Client(t), name)

	rev := etcdtest.Revision(t, admin)
	start := time.Now()
	for _, tc := range []struct {
		desc string
		m    *reentrant.Mutex
		ctx  context.Context
	}{
		{"another handle", other, ctx},
		{"a fresh context on the holder's handle", holder, ctx},
		{"the owning context on another handle", other, octx},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := tc.m.TryLock(tc.ctx)
			assert.ErrorIs(t, err, reentrant.ErrLocked)
			assert.True(t, got == tc.ctx)
		})
	}
	assert.Less(t, time.Since(start), 5*time.Second, "TryLock waited")
	etcdtest.NoWrites(t, admin, rev, "a failed TryLock wrote")
	assert.Len(t, keysOf(t, admin, name), 1)
	assert.ErrorIs(t, other.Err(), reentrant.ErrNotLocked)
	assert.Zero(t, other.Token())

	// The owner's own TryLock re-enters.
	_, err = holder.TryLock(octx)
	require.NoError(t, err)
	assert.Equal(t, 2, holder.Count(octx))
	etcdtest.NoWrites(t, admin, rev, "wrote")
	require.NoError(t, holder.Unlock(octx))
	require.NoError(t, holder.Unlock(octx))
	tctx, err := other.TryLock(ctx)
	require.NoError(t, err)
	require.NoError(t, other.Unlock(tctx))
	assert.Empty(t, keysOf(t, admin, name))
}

func TestKeyValueNamesTheOwner(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "owner-value"
	admin := cluster.Client(t)
	m := newMutex(t, cluster.Client(t), name)
	value := regexp.MustCompile(`^host=(\S+) pid=(\d+) since=\S+ owner=([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)
	host, err := os.Hostname()
	require.NoError(t, err)

	var owners []string
	for range 2 {
		octx, err := m.Lock(ctx)
		require.NoError(t, err)
		keys := keysOf(t, admin, name)
		require.Len(t, keys, 1)
		got := value.FindStringSubmatch(string(keys[0].Value))
		require.NotNil(t, got, "value %q", keys[0].Value)
		assert.Equal(t, host, got[1])
		assert.Equal(t, strconv.Itoa(os.Getpid()), got[2])
		owners = append(owners, got[3])
		assert.Equal(t, string(keys[0].Key), m.Key(), "Key while held")
		require.NoError(t, m.Unlock(octx))
		assert.Empty(t, m.Key(), "Key once released")
	}
	assert.NotEqual(t, owners[0], owners[1], "two owners with one id")
}

func TestExcludesMutexAndEtcdMutexOnTheSameName(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "interop"
	ours := newMutex(t, cluster.Client(t), name)
	plain, err := mutex.New(cluster.Client(t), name)
	require.NoError(t, err)
	sess, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer sess.Close()
	etcds := concurrency.NewMutex(sess, name)

	octx, err := ours.Lock(ctx)
	require.NoError(t, err)
	assert.ErrorIs(t, plain.TryLock(ctx), mutex.ErrLocked)
	assert.ErrorIs(t, etcds.TryLock(ctx), concurrency.ErrLocked)
	require.NoError(t, ours.Unlock(octx))

	require.NoError(t, plain.Lock(ctx))
	_, err = ours.TryLock(ctx)
	assert.ErrorIs(t, err, reentrant.ErrLocked)
	require.NoError(t, plain.Unlock(ctx))

	require.NoError(t, etcds.Lock(ctx))
	_, err = ours.TryLock(ctx)
	assert.ErrorIs(t, err, reentrant.ErrLocked)
	require.NoError(t, etcds.Unlock(ctx))
}

// TestCountIsZeroWithoutAHold: Count asks nothing of etcd and says 0 without a hold. (Bad
// input and calls without a hold of every package: primtest's
// TestBadInputIsRejectedAndWritesNothing.)
func TestCountIsZeroWithoutAHold(t *testing.T) {
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	assert.Zero(t, newMutex(t, cli, "count").Count(etcdtest.Context(t)))
	etcdtest.NoWrites(t, cli, before, "Count wrote to etcd")
}

func TestIsOwnerGuardsWritesOnlyWhileHeld(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	m := newMutex(t, cli, "is-owner")
	fencedPut := func(v string) bool {
		resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("is-owner-data", v)).Commit()
		require.NoError(t, err)
		return resp.Succeeded
	}
	assert.False(t, fencedPut("before"), "IsOwner held before Lock")
	octx, err := m.Lock(ctx)
	require.NoError(t, err)
	_, err = m.Lock(octx)
	require.NoError(t, err)
	require.NoError(t, m.Unlock(octx))
	assert.True(t, fencedPut("held"), "IsOwner failed with one Lock to go")
	require.NoError(t, m.Unlock(octx))
	assert.False(t, fencedPut("after"), "IsOwner held after the last Unlock")
	resp, err := cli.Get(ctx, "is-owner-data")
	require.NoError(t, err)
	assert.Equal(t, "held", string(resp.Kvs[0].Value))
}
