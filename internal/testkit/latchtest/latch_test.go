package latch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
)

// TestEveryWaiterIsWoken: waiters on clients of their own, and several on one handle (the
// waiters Redisson woke one of, #5349), wait while the count is above zero and all return
// at the last count down; Count follows.
func TestEveryWaiterIsWoken(t *testing.T) {
	ctx := testContext(t)
	const name = "woken"
	fresh(t, name)
	setter := newLatch(t, cluster.Client(t), name)
	require.NoError(t, setter.Set(ctx, 3))
	shared := newLatch(t, cluster.Client(t), name)
	var waits []<-chan error
	for range 3 {
		waits = append(waits, etcdtest.Async(func() error { return shared.Await(ctx) }))
		own := newLatch(t, cluster.Client(t), name)
		waits = append(waits, etcdtest.Async(func() error { return own.Await(ctx) }))
	}
	for i := 3; i > 0; i-- {
		n, err := setter.Count(ctx)
		require.NoError(t, err)
		require.Equal(t, i, n)
		for j, w := range waits {
			etcdtest.Pending(t, w, fmt.Sprintf("waiter %d at a count of %d", j, i))
		}
		require.NoError(t, newLatch(t, cluster.Client(t), name).CountDown(ctx))
	}
	for j, w := range waits {
		require.NoError(t, etcdtest.Within(t, w, 30*time.Second, fmt.Sprintf("waiter %d", j)))
	}
	n, err := setter.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	// At zero, a count down does nothing, and a wait returns at once.
	require.NoError(t, setter.CountDown(ctx))
	n, err = setter.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	require.NoError(t, setter.Await(ctx))
}

// TestSetOnce: a second Set fails with ErrAlreadySet, with the same count too, and writes
// nothing.
func TestSetOnce(t *testing.T) {
	ctx := testContext(t)
	const name = "once"
	fresh(t, name)
	cli := cluster.Client(t)
	require.NoError(t, newLatch(t, cli, name).Set(ctx, 2))
	since := etcdtest.Revision(t, cli)
	for _, count := range []int{2, 5} {
		err := newLatch(t, cluster.Client(t), name).Set(ctx, count)
		assert.ErrorIs(t, err, latch.ErrAlreadySet, "Set(%d)", count)
	}
	etcdtest.NoWrites(t, cli, since, "a second Set")
}

// TestCountDownBeforeSet: a count down without a count says ErrNotSet and writes nothing;
// so does Count. A wait begun before the Set waits for it, and then for zero.
func TestCountDownBeforeSet(t *testing.T) {
	ctx := testContext(t)
	const name = "before"
	fresh(t, name)
	cli := cluster.Client(t)
	l := newLatch(t, cli, name)
	wait := etcdtest.Async(func() error { return newLatch(t, cluster.Client(t), name).Await(ctx) })
	since := etcdtest.Revision(t, cli)
	assert.ErrorIs(t, l.CountDown(ctx), latch.ErrNotSet)
	assert.ErrorIs(t, l.CountDownAs(ctx, "worker-1"), latch.ErrNotSet)
	_, err := l.Count(ctx)
	assert.ErrorIs(t, err, latch.ErrNotSet)
	etcdtest.NoWrites(t, cli, since, "count downs before the Set")
	etcdtest.Pending(t, wait, "a wait before the Set")
	require.NoError(t, l.Set(ctx, 1))
	etcdtest.Pending(t, wait, "a wait at a count of 1")
	require.NoError(t, l.CountDown(ctx))
	require.NoError(t, etcdtest.Within(t, wait, 30*time.Second, "the wait"))
}

// TestNamedParticipantCountsOnce: a participant that names itself counts once, however
// often it calls, from any handle or client; unnamed count downs count each.
func TestNamedParticipantCountsOnce(t *testing.T) {
	ctx := testContext(t)
	const name = "named"
	fresh(t, name)
	l := newLatch(t, cluster.Client(t), name)
	require.NoError(t, l.Set(ctx, 4))
	for range 3 {
		require.NoError(t, newLatch(t, cluster.Client(t), name).CountDownAs(ctx, "worker/1"))
	}
	n, err := l.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "after worker/1 three times")
	require.NoError(t, l.CountDownAs(ctx, "worker/2"))
	require.NoError(t, l.CountDown(ctx))
	n, err = l.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.NoError(t, l.CountDown(ctx))
	require.NoError(t, l.Await(ctx))
}

// TestATimedOutWaitLeavesNothing: a wait that times out returns ctx's error and has
// written nothing.
func TestATimedOutWaitLeavesNothing(t *testing.T) {
	const name = "timeout"
	fresh(t, name)
	cli := cluster.Client(t)
	require.NoError(t, newLatch(t, cli, name).Set(testContext(t), 1))
	since := etcdtest.Revision(t, cli)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := newLatch(t, cluster.Client(t), name).Await(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	etcdtest.NoWrites(t, cli, since, "a timed-out wait")
}

// TestDeleteEndsTheWait: a latch deleted above zero fails its waiters with ErrNotSet, and
// may be set again.
func TestDeleteEndsTheWait(t *testing.T) {
	ctx := testContext(t)
	const name = "delete"
	fresh(t, name)
	l := newLatch(t, cluster.Client(t), name)
	require.NoError(t, l.Set(ctx, 2))
	require.NoError(t, l.CountDownAs(ctx, "a"))
	cli, read := etcdtest.TxnsAnswered(t, cluster, -1, 1)
	wait := etcdtest.Async(func() error { return newLatch(t, cli, name).Await(ctx) })
	etcdtest.Within(t, read, 30*time.Second, "the wait's read")
	etcdtest.Pending(t, wait, "the wait")
	require.NoError(t, l.Delete(ctx))
	assert.ErrorIs(t, etcdtest.Within(t, wait, 30*time.Second, "the wait"), latch.ErrNotSet)
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), latchKeys(name)))
	require.NoError(t, l.Set(ctx, 1))
	require.NoError(t, l.CountDownAs(ctx, "a"), "a participant of the deleted count counts again")
	require.NoError(t, l.Await(ctx))
}

// TestAWaitAfterZeroReturnsWhateverTheRevision: once the count is zero, a wait returns at
// once, after other writes moved the revision on and history was compacted (the wait etcd's
// Barrier kept up after its release, PR #16223).
func TestAWaitAfterZeroReturnsWhateverTheRevision(t *testing.T) {
	etcdtest.OwnMembers(t) // a compaction would cut other packages' watches short
	ctx := testContext(t)
	const name = "after"
	fresh(t, name)
	cli := cluster.Client(t)
	l := newLatch(t, cli, name)
	require.NoError(t, l.Set(ctx, 1))
	require.NoError(t, l.CountDown(ctx))
	for i := range 20 {
		_, err := cli.Put(ctx, fmt.Sprintf("after-other/%d", i), "x")
		require.NoError(t, err)
	}
	_, err := cli.Compact(ctx, etcdtest.Revision(t, cli))
	require.NoError(t, err)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error {
		return newLatch(t, cluster.Client(t), name).Await(ctx)
	}), 10*time.Second, "a wait after zero"))
	_, err = cli.Delete(ctx, "after-other/", clientv3.WithPrefix())
	require.NoError(t, err)
}

// TestAWaiterBackAfterCompactionHearsZero: a waiter whose member stops after it read, while
// the count reaches zero on the others and history is compacted past what its watch
// delivered, is told when its member is back: the client resumes its watch from a compacted
// revision, which etcd cancels, and the wait reads again (the review's case of a watch
// placed again after a reconnect).
func TestAWaiterBackAfterCompactionHearsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a member of a cluster of its own: not in the short tier")
	}
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()
	ctx := testContext(t)
	const name = "compacted"
	cli := etcdtest.PinnedClient(t, c, 1)
	l := newLatch(t, cli, name)
	require.NoError(t, l.Set(ctx, 2))
	far, read := etcdtest.TxnsAnswered(t, c, 0, 1)
	wait := etcdtest.Async(func() error { return newLatch(t, far, name).Await(ctx) })
	etcdtest.Within(t, read, 30*time.Second, "the wait's read")
	c.Stop(0)
	require.NoError(t, l.CountDown(ctx))
	require.NoError(t, l.CountDown(ctx))
	_, err = cli.Compact(ctx, etcdtest.Revision(t, cli), clientv3.WithCompactPhysical())
	require.NoError(t, err)
	etcdtest.Pending(t, wait, "the wait, its member stopped")
	require.NoError(t, c.Restart(0))
	require.NoError(t, etcdtest.Within(t, wait, 30*time.Second, "the wait"))
}

// TestBadInput: bad names, counts, participants and options are refused, and write nothing;
// a Latch not made by New refuses every call.
func TestBadInput(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	since := etcdtest.Revision(t, cli)
	_, err := latch.New(cli, "")
	assert.ErrorIs(t, err, latch.ErrInvalidName)
	_, err = latch.New(nil, "x")
	assert.ErrorIs(t, err, latch.ErrInvalidOption)
	for _, opt := range []latch.Option{
		latch.Option(nil), latch.WithPrefix("no-slash"),
		etcdsync.WithTTL(10 * time.Second), etcdsync.WithMaxHold(time.Minute), etcdsync.WithLockDelay(time.Second),
	} {
		_, err = latch.New(cli, "x", opt)
		assert.ErrorIs(t, err, latch.ErrInvalidOption)
	}
	l := newLatch(t, cli, "bad")
	for _, count := range []int{0, -1, latch.MaxCount + 1} {
		assert.ErrorIs(t, l.Set(ctx, count), latch.ErrInvalidOption, "Set(%d)", count)
	}
	assert.ErrorIs(t, l.CountDownAs(ctx, "a\x00b"), latch.ErrInvalidName)
	var zero latch.Latch
	var none *latch.Latch
	for _, u := range []*latch.Latch{&zero, none} {
		assert.ErrorIs(t, u.Set(ctx, 1), latch.ErrInvalidOption)
		assert.ErrorIs(t, u.CountDown(ctx), latch.ErrInvalidOption)
		assert.ErrorIs(t, u.Await(ctx), latch.ErrInvalidOption)
		_, err := u.Count(ctx)
		assert.ErrorIs(t, err, latch.ErrInvalidOption)
		assert.ErrorIs(t, u.Delete(ctx), latch.ErrInvalidOption)
	}
	etcdtest.NoWrites(t, cli, since, "bad input")
}
