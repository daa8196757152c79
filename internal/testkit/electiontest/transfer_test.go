package election_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestTransferHandsTheLeadershipToTheChosenCandidate: a leader transfers to the fourth of
// five candidates, on clients of their own (so that it waits far back, approaching): it
// leads at once on the leader's key and token, observers see one change, and the
// candidates passed over (one of them etcd's own Election's) keep waiting, and lead in
// their order after it.
func TestTransferHandsTheLeadershipToTheChosenCandidate(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-chosen"
	admin := cluster.Client(t)
	watcher := newElection(t, cluster.Client(t), name)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs := watcher.Observe(octx)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs), "no leader yet")

	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	token, key := leader.Token(), leader.Key()
	assert.Equal(t, election.Leader{Value: "leader", Token: token}, primtest.NextLeader(t, obs))

	c1 := newElection(t, cluster.Client(t), name)
	c1won := campaignAsync(ctx, c1, "c1")
	primtest.AwaitKeys(t, admin, name, 2)
	theirs := etcdElection(t, name)
	theirsWon := etcdtest.Async(func() error { return theirs.Campaign(ctx, "theirs") })
	primtest.AwaitKeys(t, admin, name, 3)
	chosen := newElection(t, cluster.Client(t), name)
	chosenWon := campaignAsync(ctx, chosen, "chosen")
	primtest.AwaitKeys(t, admin, name, 4)
	c4 := newElection(t, cluster.Client(t), name)
	c4won := campaignAsync(ctx, c4, "c4")
	primtest.AwaitKeys(t, admin, name, 5)

	require.NoError(t, leader.Transfer(ctx, "chosen"))
	require.NoError(t, etcdtest.Within(t, chosenWon, 10*time.Second, "the chosen candidate's Campaign"))
	assert.Equal(t, token, chosen.Token(), "the token passes with the key")
	assert.Equal(t, key, chosen.Key())
	require.NoError(t, chosen.Err())
	assert.ErrorIs(t, leader.Err(), election.ErrNotLeader)
	assert.Zero(t, leader.Token())
	assert.Equal(t, election.Leader{Value: "chosen", Token: token}, primtest.NextLeader(t, obs), "one change per transfer")
	l, err := leader.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "chosen", Token: token}, l)
	resp, err := theirs.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "chosen", string(resp.Kvs[0].Value), "etcd's Election sees the new leader")
	primtest.AwaitKeys(t, admin, name, 4) // the chosen candidate's own key went
	n, err := admin.Get(ctx, core.HandoverRecordKey(core.NamePrefix(name), ""), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Zero(t, n.Count, "the record of the handover is gone once accepted")
	for _, w := range []<-chan error{c1won, theirsWon, c4won} {
		etcdtest.Pending(t, w, "a candidate passed over")
	}

	// The order behind it is unchanged.
	require.NoError(t, chosen.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, c1won, 10*time.Second, "the first candidate passed over"))
	assert.Greater(t, c1.Token(), token)
	etcdtest.Pending(t, theirsWon, "etcd's candidate, behind the first")
	require.NoError(t, c1.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, theirsWon, 10*time.Second, "etcd's candidate"))
	etcdtest.Pending(t, c4won, "the last candidate")
	require.NoError(t, theirs.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, c4won, 10*time.Second, "the last candidate"))
	require.NoError(t, c4.Resign(ctx))
	for _, want := range []string{"c1", "theirs", "c4", ""} {
		assert.Equal(t, want, primtest.NextLeader(t, obs).Value)
	}
	primtest.AwaitKeys(t, admin, name, 0)
}

// TestTransferRefusalsChangeNothing: a value no candidate has, a candidate of etcd's own
// Election, the leader's own value, no leadership: errors, and nothing written.
func TestTransferRefusalsChangeNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-refused"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	theirs := etcdElection(t, name)
	theirsWon := etcdtest.Async(func() error { return theirs.Campaign(ctx, "theirs") })
	other := newElection(t, cluster.Client(t), name)
	assert.ErrorIs(t, other.Transfer(ctx, "theirs"), election.ErrNotLeader, "without leadership")
	primtest.AwaitKeys(t, admin, name, 2)

	since := etcdtest.Revision(t, admin)
	for _, to := range []string{"nobody", "theirs", "leader"} {
		err := leader.Transfer(ctx, to)
		assert.ErrorIs(t, err, election.ErrNoCandidate, "to %q", to)
	}
	assert.ErrorIs(t, (&election.Election{}).Transfer(ctx, "x"), election.ErrInvalidOption)
	etcdtest.NoWrites(t, admin, since, "refused transfers")
	require.NoError(t, leader.Err())
	etcdtest.Pending(t, theirsWon, "etcd's candidate")
	require.NoError(t, leader.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, theirsWon, 10*time.Second, "etcd's candidate"))
	require.NoError(t, theirs.Resign(ctx))
}

// TestTransferOfARunEndsLeadFirst: Transfer ends a Run's lead (cause ErrNotLocked) and
// returns only after lead has returned, even with an error; the Run then campaigns again,
// behind the chosen candidate, and leads again after it.
func TestTransferOfARunEndsLeadFirst(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-run"
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	rctx, stopRun := context.WithCancel(ctx)
	var terms, returned atomic.Int64
	leading := make(chan struct{}, 2)
	causes := make(chan error, 2)
	ran := etcdtest.Async(func() error {
		return e.Run(rctx, "run", func(lctx context.Context) error {
			terms.Add(1)
			leading <- struct{}{}
			<-lctx.Done()
			causes <- context.Cause(lctx)
			time.Sleep(50 * time.Millisecond) // the work winds down: Transfer waits for it
			returned.Add(1)
			return lctx.Err() // an error after the end of the term does not stop Run
		})
	})
	etcdtest.Within(t, leading, 10*time.Second, "the first term")
	chosen := newElection(t, cluster.Client(t), name)
	chosenWon := campaignAsync(ctx, chosen, "chosen")
	primtest.AwaitKeys(t, admin, name, 2)

	require.NoError(t, e.Transfer(ctx, "chosen"))
	assert.EqualValues(t, 1, returned.Load(), "Transfer returned before lead did")
	assert.ErrorIs(t, etcdtest.Within(t, causes, time.Second, "lead's cause"), election.ErrNotLocked)
	require.NoError(t, etcdtest.Within(t, chosenWon, 10*time.Second, "the chosen candidate"))
	primtest.AwaitKeys(t, admin, name, 2) // the Run campaigns again, behind it
	assert.EqualValues(t, 1, terms.Load())
	require.NoError(t, chosen.Resign(ctx))
	etcdtest.Within(t, leading, 10*time.Second, "the Run's second term")
	stopRun()
	assert.ErrorIs(t, etcdtest.Within(t, ran, 10*time.Second, "Run"), context.Canceled)
	primtest.AwaitKeys(t, admin, name, 0)
}

// TestATransferNobodyAnswersChangesNothing: the chosen key is of etcdsync's layout but
// nobody waits on it (a process that died, or of an older version, which does not answer):
// after the wait the leader's key is untouched, on its lease with its value, and it still
// leads; the candidate's key went with the proposal, and no record is left.
func TestATransferNobodyAnswersChangesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-unanswered"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	lease := leaderLease(t, admin, name)
	grant, err := admin.Grant(ctx, 60)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Revoke(context.Background(), grant.ID) })
	old := fmt.Sprintf("%s%x_0", core.NamePrefix(name), grant.ID)
	_, err = admin.Put(ctx, old, "old", clientv3.WithLease(grant.ID))
	require.NoError(t, err)

	start := time.Now()
	err = leader.Transfer(ctx, "old")
	assert.ErrorIs(t, err, election.ErrNoCandidate)
	assert.Contains(t, err.Error(), "did not answer")
	assert.Greater(t, time.Since(start), 4*time.Second, "the leader waits for the candidate to answer")
	require.NoError(t, leader.Err(), "the leader leads on")
	assert.Equal(t, lease, leaderLease(t, admin, name))
	l, err := leader.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "leader", Token: leader.Token()}, l)
	resp, err := admin.Get(ctx, old)
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "the candidate's key went with the proposal")
	n, err := admin.Get(ctx, strings.TrimSuffix(core.NamePrefix(name), "/")+"\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Zero(t, n.Count, "no record left")
	require.NoError(t, leader.Resign(ctx))
	primtest.AwaitKeys(t, admin, name, 0)
}

// TestAPreferredCandidateThatComesLaterTakesOver: a more preferred candidate that comes
// after the leader has led a settle time (so the leader's asker waits for nothing timed)
// takes over once it has waited its own; its arrival arms the leader's timer. (It did not:
// `etcdsync elect --prefer` hung on every real cluster in CI.)
func TestAPreferredCandidateThatComesLaterTakesOver(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, settle = "transfer-preferred-later", 200 * time.Millisecond
	watcher := newElection(t, cluster.Client(t), name)
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	obs := watcher.Observe(octx)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))
	rctx, stopRuns := context.WithCancel(ctx)
	var runs []<-chan error
	start := func(value string, pref int) {
		e := newElection(t, cluster.Client(t), name, election.WithPreference(pref), election.WithSettle(settle))
		runs = append(runs, etcdtest.Async(func() error {
			return e.Run(rctx, value, func(lctx context.Context) error {
				<-lctx.Done()
				return nil
			})
		}))
	}
	start("low", 0)
	assert.Equal(t, "low", primtest.NextLeader(t, obs).Value)
	time.Sleep(5 * settle) // the point: the leader has led longer than its settle time
	start("high", 5)
	assert.Equal(t, "high", primtest.NextLeader(t, obs).Value, "the preferred candidate that came later leads")
	stopRuns()
	for _, r := range runs {
		assert.ErrorIs(t, etcdtest.Within(t, r, 10*time.Second, "a Run"), context.Canceled)
	}
	primtest.AwaitKeys(t, cluster.Client(t), name, 0)
}

// TestAMorePreferredCandidateTakesOverAfterTheSettleTime: Runs of preference 0, 0, 5 and 3
// on one name: the leader of preference 0 hands over to the candidate of 5 once it has
// waited the settle time, ahead of the one of 0 that came before it; that leader never
// hands over to the candidate of 3, nor back.
func TestAMorePreferredCandidateTakesOverAfterTheSettleTime(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, settle = "transfer-preferred", 300 * time.Millisecond
	admin := cluster.Client(t)
	watcher := newElection(t, cluster.Client(t), name)
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	obs := watcher.Observe(octx)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))

	rctx, stopRuns := context.WithCancel(ctx)
	var terms [4]atomic.Int64
	var runs []<-chan error
	start := func(i int, value string, pref int) {
		e := newElection(t, cluster.Client(t), name, election.WithPreference(pref), election.WithSettle(settle))
		runs = append(runs, etcdtest.Async(func() error {
			return e.Run(rctx, value, func(lctx context.Context) error {
				terms[i].Add(1)
				<-lctx.Done()
				return nil
			})
		}))
	}
	start(0, "low", 0)
	assert.Equal(t, "low", primtest.NextLeader(t, obs).Value)
	start(1, "also-low", 0)
	primtest.AwaitKeys(t, admin, name, 2)
	began := time.Now()
	start(2, "high", 5)
	assert.Equal(t, "high", primtest.NextLeader(t, obs).Value, "the most preferred leads")
	assert.GreaterOrEqual(t, time.Since(began), settle, "not before it waited the settle time")
	start(3, "middle", 3)
	primtest.AwaitKeys(t, admin, name, 4) // the three others wait
	select {
	case l := <-obs:
		t.Fatalf("the leader changed to %+v: a transfer to a less preferred candidate", l)
	case <-time.After(4 * settle):
	}
	assert.EqualValues(t, 1, terms[0].Load())
	assert.Zero(t, terms[1].Load(), "the candidate passed over never led")
	assert.EqualValues(t, 1, terms[2].Load())
	assert.Zero(t, terms[3].Load())
	stopRuns()
	for _, r := range runs {
		assert.ErrorIs(t, etcdtest.Within(t, r, 10*time.Second, "a Run"), context.Canceled)
	}
	primtest.AwaitKeys(t, admin, name, 0)
}

// TestRequestTransferMovesALeadership: a request moves a Run's leadership to the candidate
// named, then steps the new leader (a Campaign that heeds Asked) down; a request nobody
// heeds is withdrawn when its ctx ends; one naming nobody is answered at once.
func TestRequestTransferMovesALeadership(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-request"
	admin := cluster.Client(t)
	asker := newElection(t, cluster.Client(t), name)
	_, err := asker.RequestTransfer(ctx, "b")
	assert.ErrorIs(t, err, election.ErrNoLeader)

	a := newElection(t, cluster.Client(t), name)
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	leading := make(chan struct{}, 4)
	ran := etcdtest.Async(func() error {
		return a.Run(rctx, "a", func(lctx context.Context) error {
			leading <- struct{}{}
			<-lctx.Done()
			return nil
		})
	})
	etcdtest.Within(t, leading, 10*time.Second, "the Run leads")
	b := newElection(t, cluster.Client(t), name)
	bwon := campaignAsync(ctx, b, "b")
	primtest.AwaitKeys(t, admin, name, 2)

	l, err := asker.RequestTransfer(ctx, "nobody")
	assert.ErrorIs(t, err, election.ErrNoCandidate)
	assert.Equal(t, "a", l.Value, "the leader stays")
	l, err = asker.RequestTransfer(ctx, "b")
	require.NoError(t, err)
	assert.Equal(t, "b", l.Value)
	require.NoError(t, etcdtest.Within(t, bwon, 10*time.Second, "b's Campaign"))
	primtest.AwaitKeys(t, admin, name, 2) // the Run campaigns again, behind b

	// b leads by Campaign: a request waits for it to heed Asked.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = asker.RequestTransfer(short, "")
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	etcdtest.AwaitKeys(t, admin, core.TransferRequestKey(core.NamePrefix(name)), 0)
	require.NoError(t, b.Yield(ctx), "nothing asked: nothing done")
	require.NoError(t, b.Err())

	asked := etcdtest.Async(func() error {
		l, err := asker.RequestTransfer(ctx, "")
		if err == nil && l.Value != "a" {
			err = fmt.Errorf("after the step-down %q leads", l.Value)
		}
		return err
	})
	etcdtest.Within(t, b.Asked(), 10*time.Second, "b is asked")
	require.NoError(t, b.Yield(ctx))
	require.NoError(t, etcdtest.Within(t, asked, 10*time.Second, "the request"))
	etcdtest.Within(t, leading, 10*time.Second, "the Run leads again")
	assert.ErrorIs(t, b.Err(), election.ErrNotLeader)
	stopRun()
	assert.ErrorIs(t, etcdtest.Within(t, ran, 10*time.Second, "Run"), context.Canceled)
	primtest.AwaitKeys(t, admin, name, 0)
}

// TestATransferToACandidateThatIsGoneChangesNothing: the candidates named are gone (their
// clients closed without resigning, as a process that died: their keys stay until their
// leases end). Transfer, and RequestTransfer, to them fail with ErrNoCandidate, and the
// Run's leader leads on: its lead's ctx is not ended, and its leadership is the same.
func TestATransferToACandidateThatIsGoneChangesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-gone"
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var terms atomic.Int64
	leading := make(chan context.Context, 2)
	ran := etcdtest.Async(func() error {
		return e.Run(rctx, "leader", func(lctx context.Context) error {
			terms.Add(1)
			leading <- lctx
			<-lctx.Done()
			return nil
		})
	})
	lctx := etcdtest.Within(t, leading, 10*time.Second, "the Run leads")
	token := e.Token()
	for i, value := range []string{"gone-1", "gone-2"} {
		inj := &etcdtest.Injector{}
		cli := inj.Client(t, cluster)
		x := newElection(t, cli, name)
		won := campaignAsync(ctx, x, value)
		primtest.AwaitKeys(t, admin, name, int64(i+2))
		// It dies: nothing more it sends gets through (no cleanup of its key, no revoke),
		// and its client closes, so that its lease is renewed no more and its key stays.
		for _, method := range []string{"Txn", "DeleteRange", "LeaseRevoke"} {
			inj.Add(etcdtest.Rule{Method: method, Action: etcdtest.Lose})
		}
		require.NoError(t, cli.Close())
		assert.Error(t, etcdtest.Within(t, won, 30*time.Second, "the gone candidate's Campaign"))
	}
	primtest.AwaitKeys(t, admin, name, 3)

	err := e.Transfer(ctx, "gone-1")
	assert.ErrorIs(t, err, election.ErrNoCandidate)
	assert.NoError(t, lctx.Err(), "lead's ctx ended for a transfer that cannot be made")
	require.NoError(t, e.Err(), "the leader leads on")
	assert.Equal(t, token, e.Token())

	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := newElection(t, cluster.Client(t), name).RequestTransfer(rctx, "gone-2")
	assert.ErrorIs(t, err, election.ErrNoCandidate)
	assert.Equal(t, election.Leader{Value: "leader", Token: token}, l)
	assert.NoError(t, lctx.Err(), "lead's ctx ended for a request that cannot be done")
	require.NoError(t, e.Err())
	assert.Equal(t, token, e.Token())
	assert.EqualValues(t, 1, terms.Load(), "one term throughout")
	etcdtest.AwaitKeys(t, admin, strings.TrimSuffix(core.NamePrefix(name), "/")+"\x00", 0) // no record or request left

	stopRun()
	assert.ErrorIs(t, etcdtest.Within(t, ran, 10*time.Second, "Run"), context.Canceled)
	_, err = admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix()) // the gone candidates' keys, if any
	require.NoError(t, err)
}

// TestARunWhoseHandoverFailsLeadsOn: the candidate answers, which ends the Run's lead, then
// gives its answer up (its Campaign's ctx ends) before lead has returned: the handover finds
// no answer, Transfer fails with ErrNoCandidate, and the Run leads on with the same
// leadership, calling lead again, instead of resigning.
func TestARunWhoseHandoverFailsLeadsOn(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-given-up"
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	leading := make(chan context.Context, 2)
	windDown := make(chan struct{})
	ran := etcdtest.Async(func() error {
		return e.Run(rctx, "run", func(lctx context.Context) error {
			leading <- lctx
			<-lctx.Done()
			select {
			case <-windDown:
			case <-rctx.Done():
			}
			return nil
		})
	})
	lctx := etcdtest.Within(t, leading, 10*time.Second, "the first term")
	token := e.Token()
	cctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	x := newElection(t, cluster.Client(t), name)
	xwon := campaignAsync(cctx, x, "x")
	primtest.AwaitKeys(t, admin, name, 2)

	transferred := etcdtest.Async(func() error { return e.Transfer(ctx, "x") })
	etcdtest.Within(t, lctx.Done(), 10*time.Second, "lead's end, once x answered")
	giveUp()
	assert.ErrorIs(t, etcdtest.Within(t, xwon, 10*time.Second, "x's Campaign"), context.Canceled)
	close(windDown)
	assert.ErrorIs(t, etcdtest.Within(t, transferred, 10*time.Second, "Transfer"), election.ErrNoCandidate)
	lctx = etcdtest.Within(t, leading, 10*time.Second, "the next term, on the same leadership")
	require.NoError(t, lctx.Err())
	require.NoError(t, e.Err())
	assert.Equal(t, token, e.Token(), "the Run leads on, with the same key")
	l, err := e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "run", Token: token}, l)
	primtest.AwaitKeys(t, admin, name, 1)
	etcdtest.AwaitKeys(t, admin, core.HandoverRecordKey(core.NamePrefix(name), ""), 0)
	stopRun()
	assert.ErrorIs(t, etcdtest.Within(t, ran, 10*time.Second, "Run"), context.Canceled)
	primtest.AwaitKeys(t, admin, name, 0)
}

// TestAnAskOfTheLeaderIsAStepDown: admin.Ask of a leader's token (etcdsync ask) asks it to
// step down, as a request without a candidate does: a leader by Campaign sees Asked close,
// Yield resigns and the next candidate leads; a Run's leader ends lead and steps down by
// itself. A wrong token writes nothing and asks nothing; the answer deletes the record.
func TestAnAskOfTheLeaderIsAStepDown(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "ask-leader"
	adm := cluster.Client(t)
	records := strings.TrimSuffix(core.NamePrefix(name), "/") + "\x00asked/"

	a := newElection(t, cluster.Client(t), name)
	require.NoError(t, a.Campaign(ctx, "a"))
	b := newElection(t, cluster.Client(t), name)
	bwon := campaignAsync(ctx, b, "b")
	primtest.AwaitKeys(t, adm, name, 2)
	asked := a.Asked()
	require.NotNil(t, asked)

	assert.ErrorIs(t, admin.Ask(ctx, adm, name, a.Token()-1, "wrong"), admin.ErrNoHold)
	assert.Zero(t, etcdtest.CountKeys(t, adm, records), "a wrong token writes nothing")
	require.NoError(t, a.Yield(ctx), "nothing asked: nothing done")
	require.NoError(t, a.Err())

	require.NoError(t, admin.Ask(ctx, adm, name, a.Token(), "maintenance"))
	etcdtest.Within(t, asked, 10*time.Second, "a is asked")
	require.NoError(t, a.Yield(ctx))
	require.NoError(t, etcdtest.Within(t, bwon, 10*time.Second, "b's Campaign"))
	assert.ErrorIs(t, a.Err(), election.ErrNotLeader)
	etcdtest.AwaitKeys(t, adm, records, 0) // answered: deleted

	// A Run heeds it by itself: its lead ends, it steps down and campaigns again.
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	leading := make(chan int64, 4)
	ran := etcdtest.Async(func() error {
		return a.Run(rctx, "a", func(lctx context.Context) error {
			leading <- a.Token()
			<-lctx.Done()
			return nil
		})
	})
	primtest.AwaitKeys(t, adm, name, 2)
	require.NoError(t, b.Resign(ctx))
	token := etcdtest.Within(t, leading, 10*time.Second, "the Run leads")
	bwon = campaignAsync(ctx, b, "b")
	primtest.AwaitKeys(t, adm, name, 2)
	require.NoError(t, admin.Ask(ctx, adm, name, token, "maintenance"))
	require.NoError(t, etcdtest.Within(t, bwon, 10*time.Second, "b leads after the Run stepped down"))
	stopRun()
	assert.ErrorIs(t, etcdtest.Within(t, ran, 10*time.Second, "Run"), context.Canceled)
	require.NoError(t, b.Resign(ctx))
	primtest.AwaitKeys(t, adm, name, 0)
	etcdtest.AwaitKeys(t, adm, records, 0)
}
