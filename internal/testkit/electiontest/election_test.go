package election_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

func TestOneLeaderAtATimeAmongManyCandidates(t *testing.T) {
	ctx := etcdtest.Context(t)
	const candidates, terms = 6, 8
	var leading, total atomic.Int64
	var wg sync.WaitGroup
	for i := range candidates {
		e := newElection(t, cluster.Client(t), "one-leader")
		wg.Go(func() {
			for range terms {
				if !assert.NoError(t, e.Campaign(ctx, fmt.Sprint(i))) {
					return
				}
				assert.Equal(t, int64(1), leading.Add(1), "two leaders at once")
				l, err := e.Leader(ctx)
				assert.NoError(t, err)
				assert.Equal(t, election.Leader{Value: fmt.Sprint(i), Token: e.Token()}, l)
				total.Add(1)
				leading.Add(-1)
				assert.NoError(t, e.Resign(ctx))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(candidates*terms), total.Load())
	assert.Zero(t, primtest.Keys(t, cluster.Client(t), "one-leader"))
}

func TestLeaderReportsValueAndTokenOrNoLeader(t *testing.T) {
	ctx := etcdtest.Context(t)
	e := newElection(t, cluster.Client(t), "leader-read")
	other := newElection(t, cluster.Client(t), "leader-read")
	_, err := other.Leader(ctx)
	assert.ErrorIs(t, err, election.ErrNoLeader)

	require.NoError(t, e.Campaign(ctx, "alpha"))
	l, err := other.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "alpha", Token: e.Token()}, l)

	require.NoError(t, e.Proclaim(ctx, "beta"))
	l, err = other.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "beta", Token: e.Token()}, l, "Proclaim keeps the token")

	require.NoError(t, e.Resign(ctx))
	_, err = other.Leader(ctx)
	assert.ErrorIs(t, err, election.ErrNoLeader)
}

func TestProclaimWithoutLeadershipFailsAndWritesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "proclaim-fenced"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	follower := newElection(t, cluster.Client(t), name)
	waiting := campaignAsync(ctx, follower, "follower")
	primtest.AwaitKeys(t, admin, name, 2)

	before := etcdtest.Revision(t, admin)
	assert.ErrorIs(t, follower.Proclaim(ctx, "usurper"), election.ErrNotLeader, "a waiting candidate")
	bystander := newElection(t, cluster.Client(t), name)
	assert.ErrorIs(t, bystander.Proclaim(ctx, "usurper"), election.ErrNotLeader, "a handle that never campaigned")
	etcdtest.NoWrites(t, admin, before, "a refused Proclaim wrote")

	// A leader whose key was deleted behind its back is refused too, by etcd this time.
	resp, err := admin.Delete(ctx, leaderKey(t, admin, name))
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.Deleted)
	etcdtest.Within(t, leader.Done(), 10*time.Second, "Done closes once the key is deleted")
	require.NoError(t, etcdtest.Within(t, waiting, 10*time.Second, "the follower leads"))
	before = etcdtest.Revision(t, admin)
	assert.ErrorIs(t, leader.Proclaim(ctx, "deposed"), election.ErrNotLeader)
	etcdtest.NoWrites(t, admin, before, "a deposed leader's Proclaim wrote")
	l, err := follower.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "follower", l.Value)

	assert.ErrorIs(t, leader.Resign(ctx), election.ErrLost)
	require.NoError(t, follower.Resign(ctx))
}

// leaderKey is the name's first key.
func leaderKey(t *testing.T, cli *clientv3.Client, name string) string {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithFirstCreate()...)
	require.NoError(t, err)
	require.NotEmpty(t, resp.Kvs)
	return string(resp.Kvs[0].Key)
}

func TestRevokedLeaseEndsLeadershipAndTheNextCandidateLeads(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "revoked"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "old"))
	done := leader.Done()
	assert.NoError(t, leader.Err())
	oldToken := leader.Token()

	next := newElection(t, cluster.Client(t), name)
	waiting := campaignAsync(ctx, next, "new")
	primtest.AwaitKeys(t, admin, name, 2)

	_, err := admin.Revoke(ctx, leaderLease(t, admin, name))
	require.NoError(t, err)
	etcdtest.Within(t, done, 5*time.Second, "Done closes after the lease is revoked")
	assert.ErrorIs(t, leader.Err(), election.ErrLost)
	require.NoError(t, etcdtest.Within(t, waiting, 5*time.Second, "the next candidate leads"))
	assert.Greater(t, next.Token(), oldToken)
	assert.ErrorIs(t, leader.Proclaim(ctx, "old again"), election.ErrNotLeader)

	// The lost leader campaigns again without Resign: the loss is forgotten, a new lease taken.
	again := campaignAsync(ctx, leader, "old, back")
	primtest.AwaitKeys(t, admin, name, 2)
	require.NoError(t, next.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, again, 10*time.Second, "the deposed leader leads again"))
	assert.Greater(t, leader.Token(), next.Token())
	require.NoError(t, leader.Resign(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

func TestCampaignWithAnExpiredSessionFailsAndLeavesNoKey(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "expired-session"
	cli := cluster.Client(t)
	s, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer s.Close()
	_, err = cli.Revoke(ctx, s.Lease())
	require.NoError(t, err)
	e := newElection(t, cli, name, election.WithSession(s))
	assert.ErrorIs(t, e.Campaign(ctx, "v"), election.ErrLost)
	assert.Zero(t, primtest.Keys(t, cli, name))
	assert.Zero(t, e.Token())
}

func TestFailedResignKeepsLeadershipForARetry(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "resign-retry"
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	require.NoError(t, e.Campaign(ctx, "v"))
	token := e.Token()

	dead, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, e.Resign(dead), context.Canceled)
	assert.NoError(t, e.Err(), "a failed Resign dropped the leadership")
	assert.Equal(t, token, e.Token())
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name))
	require.NoError(t, e.Proclaim(ctx, "still leading"))

	require.NoError(t, e.Resign(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
	assert.ErrorIs(t, e.Resign(ctx), election.ErrNotLeader)
}

func TestCallsWithoutLeadership(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), "no-leadership")
	before := etcdtest.Revision(t, admin)
	assert.ErrorIs(t, e.Resign(ctx), election.ErrNotLeader)
	assert.ErrorIs(t, e.Proclaim(ctx, "v"), election.ErrNotLeader)
	assert.ErrorIs(t, e.Err(), election.ErrNotLeader)
	assert.ErrorIs(t, e.Err(), election.ErrNotLocked)
	assert.Zero(t, e.Token())
	etcdtest.Within(t, e.Done(), time.Second, "Done without leadership is closed")
	_, err := e.Leader(ctx)
	assert.ErrorIs(t, err, election.ErrNoLeader)
	etcdtest.NoWrites(t, admin, before, "calls without leadership wrote")

	done, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, e.Campaign(done, "v"), context.Canceled)
	assert.True(t, errors.Is(e.Err(), election.ErrNotLeader))
	etcdtest.NoWrites(t, admin, before, "a Campaign with a done context wrote")
}
