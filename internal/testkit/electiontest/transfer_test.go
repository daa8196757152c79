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

// TestATransferNobodyAcceptsIsTakenBack: the chosen key is of etcdsync's layout but nobody
// waits on it (a process of an older version, which does not accept): after the wait the
// leader has its key back, on its lease with its value, and still leads.
func TestATransferNobodyAcceptsIsTakenBack(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "transfer-taken-back"
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
	assert.Contains(t, err.Error(), "did not take the leadership over")
	assert.Greater(t, time.Since(start), 4*time.Second, "the leader waits for the candidate to accept")
	require.NoError(t, leader.Err(), "the leader leads on")
	assert.Equal(t, lease, leaderLease(t, admin, name))
	l, err := leader.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "leader", Token: leader.Token()}, l)
	resp, err := admin.Get(ctx, old)
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "the candidate's key went in the handover")
	n, err := admin.Get(ctx, strings.TrimSuffix(core.NamePrefix(name), "/")+"\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Zero(t, n.Count, "no record left")
	require.NoError(t, leader.Resign(ctx))
	primtest.AwaitKeys(t, admin, name, 0)
}
