package election_test

import (
	"context"
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

// TestARangeDeleteMakesNoCandidateLeadOnAGoneKey: an operator's `etcdctl del --prefix` takes
// the leader's and a waiting candidate's keys (other clients, other leases) at one revision.
// The candidate's Campaign must not return as leader on a key that is gone.
func TestARangeDeleteMakesNoCandidateLeadOnAGoneKey(t *testing.T) {
	const name = "range-delete"
	for i := range 5 {
		ctx := etcdtest.Context(t)
		admin := cluster.Client(t)
		leader := newElection(t, cluster.Client(t), name)
		require.NoError(t, leader.Campaign(ctx, "leader"))
		candidate := newElection(t, cluster.Client(t), name)
		won := campaignAsync(ctx, candidate, "candidate")
		primtest.AwaitKeys(t, admin, name, 2)
		_, err := admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
		require.NoError(t, err)
		assert.ErrorIs(t, etcdtest.Within(t, won, 10*time.Second, "the candidate's Campaign"), election.ErrLost,
			"round %d: the candidate leads on a deleted key", i)
		assert.ErrorIs(t, leader.Resign(ctx), election.ErrLost)
	}
}

// TestObserveTakesEveryDeleteOfARevision: the same range delete, seen by an observer: it
// reports that nobody leads, never the deleted candidate, and then the next real leader.
func TestObserveTakesEveryDeleteOfARevision(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "observe-range-delete"
	admin := cluster.Client(t)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs := newElection(t, cluster.Client(t), name).Observe(octx)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	assert.Equal(t, election.Leader{Value: "leader", Token: leader.Token()}, primtest.NextLeader(t, obs))
	candidate := newElection(t, cluster.Client(t), name)
	won := campaignAsync(ctx, candidate, "candidate")
	primtest.AwaitKeys(t, admin, name, 2)

	_, err := admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs), "a candidate whose key went at the same revision reported as leader")
	etcdtest.Within(t, won, 10*time.Second, "the candidate's Campaign")

	successor := newElection(t, cluster.Client(t), name)
	require.NoError(t, successor.Campaign(ctx, "successor"))
	assert.Equal(t, election.Leader{Value: "successor", Token: successor.Token()}, primtest.NextLeader(t, obs), "the next real leader")
	require.NoError(t, successor.Resign(ctx))
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))
}

// TestAFailedResignIsNeverCreditedWithALaterDelete: Resign with a cancelled ctx fails and
// leadership stays (Proclaim still works); an operator then deletes the key. That is a loss:
// Err says ErrLost, and so does the next Resign, not nil as if the failed Resign had done it.
func TestAFailedResignIsNeverCreditedWithALaterDelete(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "failed-resign"
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	require.NoError(t, e.Campaign(ctx, "v1"))
	done := e.Done()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, e.Resign(cctx), context.Canceled)
	require.NoError(t, e.Proclaim(ctx, "v2"), "the leadership survived the failed Resign")

	_, err := admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	etcdtest.Within(t, done, 10*time.Second, "Done once the key is deleted")
	assert.ErrorIs(t, e.Err(), election.ErrLost)
	assert.ErrorIs(t, e.Resign(ctx), election.ErrLost, "a loss reported as a resignation")
}
