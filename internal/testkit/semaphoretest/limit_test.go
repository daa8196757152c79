package semaphore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/semaphore"
)

// freshName deletes what an earlier run (-count) left of name's limit.
func freshName(t *testing.T, name string) {
	t.Helper()
	_, err := cluster.Client(t).Delete(testContext(t), core.NamePrefix(name)+core.RecordLimit, clientv3.WithPrefix())
	require.NoError(t, err)
}

// limitKeys is what etcd holds of name's limit: the record's value, and the markers' keys
// relative to the name.
func limitKeys(t *testing.T, cli *clientv3.Client, name string) (record string, markers []string) {
	t.Helper()
	resp, err := cli.Get(testContext(t), core.NamePrefix(name)+core.RecordLimit, clientv3.WithPrefix())
	require.NoError(t, err)
	for _, kv := range resp.Kvs {
		if k := string(kv.Key)[len(core.NamePrefix(name)):]; k == core.RecordLimit {
			record = string(kv.Value)
		} else {
			markers = append(markers, k)
		}
	}
	return record, markers
}

// outcome waits for an acquisition's outcome, which must come.
func outcome(t *testing.T, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("the acquisition was not served")
		return acquired{}
	}
}

// notServed asserts that an acquisition has no outcome yet. A wrong serve is decided when
// the hub dispatches the release (the caller has seen that dispatched) and returns
// microseconds later; the grace makes a miss unlikely and never fails a sound run.
func notServed(t *testing.T, ch <-chan acquired, why string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s: served (%v)", why, a.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestARaiseServesTheWaitersThatNowFit: five waiters on clients of their own queue behind
// the one permit of a limit of 1 (the farther ones approach: they watch a few keys ahead,
// and the limit's marker); a raise to 4 serves the first three at once, and one to 6 the
// rest, while the first holder still holds. A waiter's handle, made with the old limit,
// then takes as many units as the new one allows.
func TestARaiseServesTheWaitersThatNowFit(t *testing.T) {
	ctx := testContext(t)
	const name = "raise"
	freshName(t, name)
	admin := cluster.Client(t)
	holder := newSemaphore(t, cluster.Client(t), name, 1)
	p, err := holder.Acquire(ctx)
	require.NoError(t, err)
	var waiters []*semaphore.Semaphore
	var outcomes []<-chan acquired
	for i := range 5 {
		s := newSemaphore(t, cluster.Client(t), name, 1)
		waiters = append(waiters, s)
		outcomes = append(outcomes, acquireAsync(ctx, s))
		awaitPermits(t, admin, name, int64(i+2)) // in this order
	}

	require.NoError(t, newSemaphore(t, cluster.Client(t), name, 1).SetLimit(ctx, 4))
	var held []*semaphore.Permit
	for i := range 3 {
		a := outcome(t, outcomes[i])
		require.NoError(t, a.err, "waiter %d", i)
		held = append(held, a.p)
		assert.Equal(t, 4, waiters[i].Limit(), "waiter %d: the limit it was served under", i)
	}
	n, err := holder.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, 4, holder.Limit(), "InUse reads the limit too")
	notServed(t, outcomes[3], "the fourth waiter, with 4 units held of 4")

	require.NoError(t, newSemaphore(t, cluster.Client(t), name, 1).SetLimit(ctx, 6))
	for i := 3; i < 5; i++ {
		a := outcome(t, outcomes[i])
		require.NoError(t, a.err, "waiter %d", i)
		held = append(held, a.p)
	}
	record, markers := limitKeys(t, admin, name)
	assert.Equal(t, "6", record)
	assert.Equal(t, []string{"limit/6"}, markers, "one marker, the limit's")

	require.NoError(t, p.Release(ctx))
	for _, p := range held {
		require.NoError(t, p.Release(ctx))
	}
	big, err := waiters[0].AcquireN(ctx, 6)
	require.NoError(t, err, "a handle made with the old limit takes what the new one allows")
	assert.Equal(t, 6, waiters[0].Limit())
	require.NoError(t, big.Release(ctx))
	assert.Zero(t, permitsOf(t, admin, name))
}

// TestALoweringServesNobodyNewUntilTheUnitsFit: three permits of a limit of 3 hold when it
// is lowered to 1; they keep holding (InUse and status count them), and a waiter is served
// only once the last of them is released, not while two or one are left.
func TestALoweringServesNobodyNewUntilTheUnitsFit(t *testing.T) {
	ctx := testContext(t)
	const name = "lower"
	freshName(t, name)
	cli := cluster.Client(t)
	s := newSemaphore(t, cli, name, 3)
	var held []*semaphore.Permit
	for range 3 {
		p, err := s.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, p)
	}
	w := newSemaphore(t, cluster.Client(t), name, 3)
	served := acquireAsync(ctx, w)
	awaitPermits(t, cli, name, 4)
	require.NoError(t, s.SetLimit(ctx, 1))

	n, err := s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "the permits held before the lowering still hold")
	snap, err := admin.Status(ctx, cli, []string{name})
	require.NoError(t, err)
	require.Len(t, snap.Names, 1)
	var states []string
	for _, e := range snap.Names[0].Queue {
		states = append(states, e.State)
	}
	assert.Equal(t, []string{admin.StateHolds, admin.StateHolds, admin.StateHolds, admin.StateWaits}, states)

	arm, stop := w.WatchRelease()
	defer stop()
	for i, p := range held {
		released := arm()
		require.NoError(t, p.Release(ctx))
		if i == len(held)-1 {
			break
		}
		select {
		case <-released: // the waiter's client has dispatched the release
		case <-ctx.Done():
			t.Fatal("the release never reached the waiter's client")
		}
		notServed(t, served, "a waiter with units in use beyond the lowered limit")
		n, err := s.InUse(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2-i, n)
	}
	a := outcome(t, served)
	require.NoError(t, a.err)
	require.NoError(t, a.p.Release(ctx))
	assert.Zero(t, permitsOf(t, cli, name))
}

// TestAWaiterForMoreThanALoweredLimitFails: a waiter for 3 units when the limit is lowered
// to 2 can never be served: it fails with ErrLimitMismatch and deletes its key.
func TestAWaiterForMoreThanALoweredLimitFails(t *testing.T) {
	ctx := testContext(t)
	const name = "lower-below-a-waiter"
	freshName(t, name)
	cli := cluster.Client(t)
	s := newSemaphore(t, cli, name, 4)
	p, err := s.AcquireN(ctx, 4)
	require.NoError(t, err)
	served := acquireNAsync(ctx, newSemaphore(t, cluster.Client(t), name, 4), 3)
	awaitPermits(t, cli, name, 2)
	require.NoError(t, s.SetLimit(ctx, 2))
	a := outcome(t, served)
	require.ErrorIs(t, a.err, semaphore.ErrLimitMismatch)
	assert.Equal(t, int64(1), permitsOf(t, cli, name), "the waiter's key was left")
	require.NoError(t, p.Release(ctx))
}

// TestSetLimitRefusesBadInputAndWritesNothing, on a semaphore New did not make, and with a
// ctx done already.
func TestSetLimitRefusesBadInputAndWritesNothing(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	assert.ErrorIs(t, newSemaphore(t, cli, "set-limit-bad", 2).SetLimit(ctx, 0), semaphore.ErrInvalidOption)
	assert.ErrorIs(t, newSemaphore(t, cli, "set-limit-bad", 2).SetLimit(ctx, semaphore.MaxLimit+1), semaphore.ErrInvalidOption)
	assert.ErrorIs(t, new(semaphore.Semaphore).SetLimit(ctx, 2), semaphore.ErrInvalidOption)
	assert.Zero(t, new(semaphore.Semaphore).Limit())
	done, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, newSemaphore(t, cli, "set-limit-bad", 2).SetLimit(done, 3), context.Canceled)
	etcdtest.NoWrites(t, cli, before, "a refused SetLimit wrote")
}

// TestSetLimitsAtOnceLeaveOneLimitAndItsMarker: changes racing one another each compare
// and swap: the record ends as one of them, with that one's marker alone.
func TestSetLimitsAtOnceLeaveOneLimitAndItsMarker(t *testing.T) {
	ctx := testContext(t)
	const name = "set-limit-race"
	freshName(t, name)
	var wg sync.WaitGroup
	for i := range 4 {
		s := newSemaphore(t, cluster.Client(t), name, 1)
		wg.Go(func() { assert.NoError(t, s.SetLimit(ctx, 2+i)) })
	}
	wg.Wait()
	record, markers := limitKeys(t, cluster.Client(t), name)
	require.Len(t, markers, 1)
	assert.Equal(t, "limit/"+record, markers[0])
}

// TestARecordWithoutAMarkerIsMarkedThenChanged: a limit recorded by a version without
// markers is marked first, then changed, and a waiter queued on it is served by a raise.
func TestARecordWithoutAMarkerIsMarkedThenChanged(t *testing.T) {
	ctx := testContext(t)
	const name = "unmarked"
	freshName(t, name)
	cli := cluster.Client(t)
	_, err := cli.Put(ctx, core.NamePrefix(name)+core.RecordLimit, "1")
	require.NoError(t, err)
	s := newSemaphore(t, cli, name, 1)
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	served := acquireAsync(ctx, newSemaphore(t, cluster.Client(t), name, 1))
	awaitPermits(t, cli, name, 2)
	require.NoError(t, s.SetLimit(context.WithoutCancel(ctx), 2))
	a := outcome(t, served)
	require.NoError(t, a.err)
	record, markers := limitKeys(t, cli, name)
	assert.Equal(t, "2", record)
	assert.Equal(t, []string{"limit/2"}, markers)
	require.NoError(t, a.p.Release(ctx))
	require.NoError(t, p.Release(ctx))
}

// TestWatchReleaseWakesOnARaise: a retry of a failed TryAcquire (trylock's) is woken by a
// raise of the limit as by a release.
func TestWatchReleaseWakesOnARaise(t *testing.T) {
	ctx := testContext(t)
	const name = "watch-release-raise"
	freshName(t, name)
	s := newSemaphore(t, cluster.Client(t), name, 1)
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	arm, stop := s.WatchRelease()
	defer stop()
	_, err = s.TryAcquire(ctx)
	require.ErrorIs(t, err, semaphore.ErrNoPermits)
	woken := arm()
	require.NoError(t, newSemaphore(t, cluster.Client(t), name, 1).SetLimit(ctx, 2))
	select {
	case <-woken:
	case <-ctx.Done():
		t.Fatal("a raise did not wake the retry")
	}
	p2, err := s.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, p2.Release(ctx))
	require.NoError(t, p.Release(ctx))
}
