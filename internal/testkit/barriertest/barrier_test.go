package barrier_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// returns is how long a call that should return may take.
const returns = 30 * time.Second

// TestEnterAndLeaveTogether: of three participants, the first two wait in Enter until the
// third enters; then the first two wait in Leave until the third leaves; no key is left.
func TestEnterAndLeaveTogether(t *testing.T) {
	ctx := testContext(t)
	const name = "together"
	fresh(t, name)
	bs := []*barrier.Barrier{newBarrier(t, name, 3), newBarrier(t, name, 3), newBarrier(t, name, 3)}
	a := entering(t, ctx, bs[0], name, 1)
	b := entering(t, ctx, bs[1], name, 2)
	etcdtest.Pending(t, a, "the first Enter of three")
	etcdtest.Pending(t, b, "the second Enter of three")
	require.NoError(t, bs[2].Enter(ctx))
	require.NoError(t, etcdtest.Within(t, a, returns, "the first Enter"))
	require.NoError(t, etcdtest.Within(t, b, returns, "the second Enter"))
	assert.Less(t, bs[0].Token(), bs[1].Token())

	la := etcdtest.Async(func() error { return bs[0].Leave(ctx) })
	lb := etcdtest.Async(func() error { return bs[1].Leave(ctx) })
	etcdtest.AwaitKeys(t, cluster.Client(t), participants(name), 2) // the second left; the first waits, as first
	etcdtest.Pending(t, la, "the first Leave")
	etcdtest.Pending(t, lb, "the second Leave")
	require.NoError(t, bs[2].Leave(ctx))
	require.NoError(t, etcdtest.Within(t, la, returns, "the first Leave"))
	require.NoError(t, etcdtest.Within(t, lb, returns, "the second Leave"))
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), participants(name)))
}

// TestALoneParticipantNeverPasses: Enter of one of two participants times out (Curator's
// enter(timeout) returned true, #1290), and leaves no key (Curator PR #270).
func TestALoneParticipantNeverPasses(t *testing.T) {
	const name = "lone"
	fresh(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := newBarrier(t, name, 2).Enter(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), participants(name)), "keys left")
}

// TestNoOverAdmission: five participants of a barrier of three enter at once (etcd's
// double barrier let more in, #14603): the first three by create revision pass, the other
// two wait for the next round, which a sixth fills. The second round leaves while the first
// is still in: a round waits for its own participants only.
func TestNoOverAdmission(t *testing.T) {
	ctx := testContext(t)
	const name = "over"
	fresh(t, name)
	type outcome struct {
		i   int
		err error
	}
	var bs []*barrier.Barrier
	entered := make(chan outcome, 5)
	for i := range 5 {
		b := newBarrier(t, name, 3)
		bs = append(bs, b)
		go func() { entered <- outcome{i, b.Enter(ctx)} }()
	}
	passed := map[int]bool{}
	for range 3 {
		o := etcdtest.Within(t, entered, returns, "an Enter of the first round")
		require.NoError(t, o.err)
		passed[o.i] = true
	}
	etcdtest.AwaitKeys(t, cluster.Client(t), participants(name), 5)
	select {
	case o := <-entered:
		t.Fatalf("a fourth participant of a barrier of three passed (%v)", o.err)
	case <-time.After(200 * time.Millisecond): // bounded grace for what must not happen
	}
	sixth := newBarrier(t, name, 3)
	require.NoError(t, sixth.Enter(ctx))
	for range 2 {
		require.NoError(t, etcdtest.Within(t, entered, returns, "an Enter of the second round").err)
	}
	var first, second []*barrier.Barrier
	for i, b := range bs {
		if passed[i] {
			first = append(first, b)
		} else {
			second = append(second, b)
		}
	}
	second = append(second, sixth)
	for _, a := range first {
		for _, b := range second {
			assert.Less(t, a.Token(), b.Token(), "a later participant passed before an earlier one")
		}
	}
	leave := func(round []*barrier.Barrier, what string) {
		var left []<-chan error
		for _, b := range round {
			left = append(left, etcdtest.Async(func() error { return b.Leave(ctx) }))
		}
		for i, l := range left {
			require.NoError(t, etcdtest.Within(t, l, returns, what), "participant %d", i)
		}
	}
	leave(second, "a Leave of the second round, the first still in")
	leave(first, "a Leave of the first round")
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), participants(name)))
}

// TestReuse: two participants go through rounds, one after another, on the same handles.
func TestReuse(t *testing.T) {
	ctx := testContext(t)
	const name = "reuse"
	fresh(t, name)
	a, b := newBarrier(t, name, 2), newBarrier(t, name, 2)
	var tokens []int64
	for round := range 3 {
		ea := etcdtest.Async(func() error { return a.Enter(ctx) })
		require.NoError(t, b.Enter(ctx), "round %d", round)
		require.NoError(t, etcdtest.Within(t, ea, returns, "Enter"), "round %d", round)
		tokens = append(tokens, a.Token(), b.Token())
		la := etcdtest.Async(func() error { return a.Leave(ctx) })
		require.NoError(t, b.Leave(ctx), "round %d", round)
		require.NoError(t, etcdtest.Within(t, la, returns, "Leave"), "round %d", round)
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(tokens))), 6, "tokens %v", tokens)
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), participants(name)))
}

// TestACrashBeforeTheRoundFilledIsNotCounted: a participant whose lease goes while it
// waits in Enter (its process crashed) fails with ErrLost and is not counted: the next
// participant waits for another.
func TestACrashBeforeTheRoundFilledIsNotCounted(t *testing.T) {
	ctx := testContext(t)
	const name = "crash-before"
	fresh(t, name)
	crashing := cluster.Client(t)
	c, err := barrier.New(crashing, name, 2)
	require.NoError(t, err)
	ec := entering(t, ctx, c, name, 1)
	require.NoError(t, etcdsync.Shutdown(ctx, crashing)) // revokes its lease: its key goes
	assert.ErrorIs(t, etcdtest.Within(t, ec, returns, "the crashed Enter"), barrier.ErrLost)
	etcdtest.AwaitKeys(t, cluster.Client(t), participants(name), 0)
	b := newBarrier(t, name, 2)
	eb := entering(t, ctx, b, name, 1)
	etcdtest.Pending(t, eb, "an Enter beside a crashed participant")
	require.NoError(t, newBarrier(t, name, 2).Enter(ctx))
	require.NoError(t, etcdtest.Within(t, eb, returns, "Enter"))
}

// TestACrashAfterEnterLeavesByItself: a participant whose lease goes after Enter counts as
// left: the others' Leave returns, and its own Leave says ErrLost.
func TestACrashAfterEnterLeavesByItself(t *testing.T) {
	ctx := testContext(t)
	const name = "crash-after"
	fresh(t, name)
	crashing := cluster.Client(t)
	c, err := barrier.New(crashing, name, 2)
	require.NoError(t, err)
	ec := entering(t, ctx, c, name, 1) // the first of the round, which leaves last
	b := newBarrier(t, name, 2)
	require.NoError(t, b.Enter(ctx))
	require.NoError(t, etcdtest.Within(t, ec, returns, "Enter"))
	lb := etcdtest.Async(func() error { return b.Leave(ctx) })
	etcdtest.AwaitKeys(t, cluster.Client(t), participants(name), 1)
	etcdtest.Pending(t, lb, "a Leave beside a participant still in")
	require.NoError(t, etcdsync.Shutdown(ctx, crashing))
	require.NoError(t, etcdtest.Within(t, lb, returns, "Leave"))
	etcdtest.Within(t, c.Done(), returns, "the crashed participant's Done")
	assert.ErrorIs(t, c.Leave(ctx), barrier.ErrLost)
}

// TestAWithdrawnParticipantIsNeverCounted: an Enter cancelled before its round filled takes
// its key away, and the round fills with others only.
func TestAWithdrawnParticipantIsNeverCounted(t *testing.T) {
	ctx := testContext(t)
	const name = "withdrawn"
	fresh(t, name)
	a := entering(t, ctx, newBarrier(t, name, 3), name, 1)
	wctx, cancel := context.WithCancel(ctx)
	w := entering(t, wctx, newBarrier(t, name, 3), name, 2)
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, w, returns, "the cancelled Enter"), context.Canceled)
	assert.Equal(t, int64(1), etcdtest.CountKeys(t, cluster.Client(t), participants(name)), "keys after the withdrawal")
	c := entering(t, ctx, newBarrier(t, name, 3), name, 2)
	etcdtest.Pending(t, a, "the first Enter, with two in")
	etcdtest.Pending(t, c, "the third Enter, with two in")
	require.NoError(t, newBarrier(t, name, 3).Enter(ctx))
	require.NoError(t, etcdtest.Within(t, a, returns, "the first Enter"))
	require.NoError(t, etcdtest.Within(t, c, returns, "the third Enter"))
}

// TestAParticipantBackAfterCompactionHearsTheRoundFill: a participant whose member stops
// after it read, while its round fills on the others and history is compacted past what its
// watch delivered, is told when its member is back.
func TestAParticipantBackAfterCompactionHearsTheRoundFill(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a member of a cluster of its own: not in the short tier")
	}
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()
	ctx := testContext(t)
	const name = "compacted"
	cli := etcdtest.PinnedClient(t, c, 1)
	// The name's size recorded (docs/key-layout.md), so that a participant's Enter sends two
	// Txns, its put and its read, before it waits.
	_, err = cli.Put(ctx, core.NamePrefix(name)+"size", "2")
	require.NoError(t, err)
	far, read := etcdtest.TxnsAnswered(t, c, 0, 2)
	a, err := barrier.New(far, name, 2)
	require.NoError(t, err)
	ea := etcdtest.Async(func() error { return a.Enter(ctx) })
	etcdtest.Within(t, read, returns, "the first participant's read")
	c.Stop(0)
	b, err := barrier.New(cli, name, 2)
	require.NoError(t, err)
	require.NoError(t, b.Enter(ctx))
	_, err = cli.Compact(ctx, etcdtest.Revision(t, cli), clientv3.WithCompactPhysical())
	require.NoError(t, err)
	etcdtest.Pending(t, ea, "the first Enter, its member stopped")
	require.NoError(t, c.Restart(0))
	require.NoError(t, etcdtest.Within(t, ea, returns, "the first Enter"))
	lb := etcdtest.Async(func() error { return b.Leave(ctx) })
	require.NoError(t, a.Leave(ctx))
	require.NoError(t, etcdtest.Within(t, lb, returns, "the second Leave"))
}

// TestACancelledLeaveLeavesNoKey: a Leave that times out waiting for the others has taken
// its key away.
func TestACancelledLeaveLeavesNoKey(t *testing.T) {
	ctx := testContext(t)
	const name = "cancel-leave"
	fresh(t, name)
	a, b := newBarrier(t, name, 2), newBarrier(t, name, 2)
	ea := entering(t, ctx, a, name, 1) // first: its Leave waits for b's
	require.NoError(t, b.Enter(ctx))
	require.NoError(t, etcdtest.Within(t, ea, returns, "Enter"))
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, a.Leave(lctx), context.DeadlineExceeded)
	assert.Equal(t, int64(1), etcdtest.CountKeys(t, cluster.Client(t), participants(name)), "b's key alone")
	require.NoError(t, b.Leave(ctx))
}

// TestBadInput: bad names, sizes and options are refused; another size than the name's
// is refused at Enter, having written no key; misuse of a handle says what.
func TestBadInput(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	const name = "bad"
	fresh(t, name)
	_, err := barrier.New(cli, "", 2)
	assert.ErrorIs(t, err, barrier.ErrInvalidName)
	_, err = barrier.New(nil, name, 2)
	assert.ErrorIs(t, err, barrier.ErrInvalidOption)
	for _, n := range []int{0, -1, barrier.MaxParticipants + 1} {
		_, err = barrier.New(cli, name, n)
		assert.ErrorIs(t, err, barrier.ErrInvalidOption, "n %d", n)
	}
	for _, opt := range []barrier.Option{nil, etcdsync.WithMaxHold(time.Minute), etcdsync.WithLockDelay(time.Second)} {
		_, err = barrier.New(cli, name, 2, opt)
		assert.ErrorIs(t, err, barrier.ErrInvalidOption)
	}
	b := newBarrier(t, name, 1)
	assert.ErrorIs(t, b.Leave(ctx), barrier.ErrNotEntered)
	require.NoError(t, b.Enter(ctx), "a barrier of one")
	assert.ErrorIs(t, b.Enter(ctx), barrier.ErrInvalidOption, "a second Enter")
	require.NoError(t, b.Leave(ctx))
	assert.ErrorIs(t, b.Leave(ctx), barrier.ErrNotEntered, "a second Leave")

	since := etcdtest.Revision(t, cli)
	assert.ErrorIs(t, newBarrier(t, name, 3).Enter(ctx), barrier.ErrInvalidOption, "another n")
	etcdtest.NoWrites(t, cli, since, "an Enter with another n")
	var zero barrier.Barrier
	var none *barrier.Barrier
	for _, u := range []*barrier.Barrier{&zero, none} {
		assert.ErrorIs(t, u.Enter(ctx), barrier.ErrInvalidOption)
		assert.ErrorIs(t, u.Leave(ctx), barrier.ErrInvalidOption)
		assert.Zero(t, u.Token())
		etcdtest.Within(t, u.Done(), time.Second, "Done")
	}
}
