package election_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	"github.com/etcdsync/etcdsync/internal/etcdtest"
)

func TestOneLeaderAtATimeAmongManyCandidates(t *testing.T) {
	ctx := testContext(t)
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
	assert.Zero(t, keysOf(t, cluster.Client(t), "one-leader"))
}

func TestCandidatesLeadInArrivalOrderOnResign(t *testing.T) {
	ctx := testContext(t)
	const name, waiting = "fifo", 5
	admin := cluster.Client(t)
	first := newElection(t, cluster.Client(t), name)
	require.NoError(t, first.Campaign(ctx, "first"))

	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range waiting {
		e := newElection(t, cluster.Client(t), name)
		wg.Go(func() {
			if !assert.NoError(t, e.Campaign(ctx, fmt.Sprint(i))) {
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			assert.NoError(t, e.Resign(ctx))
		})
		awaitKeys(t, admin, name, int64(i+2)) // candidate i is in line before i+1 starts
	}
	require.NoError(t, first.Resign(ctx))
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2, 3, 4}, order)
	assert.Zero(t, keysOf(t, admin, name))
}

func TestTokensIncreaseAcrossLeaders(t *testing.T) {
	ctx := testContext(t)
	a := newElection(t, cluster.Client(t), "tokens")
	b := newElection(t, cluster.Client(t), "tokens")
	var last int64
	for i := range 6 {
		e := a
		if i%2 == 1 {
			e = b
		}
		require.NoError(t, e.Campaign(ctx, "v"))
		assert.Greater(t, e.Token(), last)
		last = e.Token()
		require.NoError(t, e.Resign(ctx))
		assert.Zero(t, e.Token())
	}
}

func TestLeaderReportsValueAndTokenOrNoLeader(t *testing.T) {
	ctx := testContext(t)
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
	ctx := testContext(t)
	const name = "proclaim-fenced"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	follower := newElection(t, cluster.Client(t), name)
	waiting := campaignAsync(ctx, follower, "follower")
	awaitKeys(t, admin, name, 2)

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
	resp, err := cli.Get(testContext(t), core.NamePrefix(name), clientv3.WithFirstCreate()...)
	require.NoError(t, err)
	require.NotEmpty(t, resp.Kvs)
	return string(resp.Kvs[0].Key)
}

func TestRevokedLeaseEndsLeadershipAndTheNextCandidateLeads(t *testing.T) {
	ctx := testContext(t)
	const name = "revoked"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "old"))
	done := leader.Done()
	assert.NoError(t, leader.Err())
	oldToken := leader.Token()

	next := newElection(t, cluster.Client(t), name)
	waiting := campaignAsync(ctx, next, "new")
	awaitKeys(t, admin, name, 2)

	_, err := admin.Revoke(ctx, leaderLease(t, admin, name))
	require.NoError(t, err)
	etcdtest.Within(t, done, 5*time.Second, "Done closes after the lease is revoked")
	assert.ErrorIs(t, leader.Err(), election.ErrLost)
	require.NoError(t, etcdtest.Within(t, waiting, 5*time.Second, "the next candidate leads"))
	assert.Greater(t, next.Token(), oldToken)
	assert.ErrorIs(t, leader.Proclaim(ctx, "old again"), election.ErrNotLeader)

	// The lost leader campaigns again without Resign: the loss is forgotten, a new lease taken.
	again := campaignAsync(ctx, leader, "old, back")
	awaitKeys(t, admin, name, 2)
	require.NoError(t, next.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, again, 10*time.Second, "the deposed leader leads again"))
	assert.Greater(t, leader.Token(), next.Token())
	require.NoError(t, leader.Resign(ctx))
	assert.Zero(t, keysOf(t, admin, name))
}

func TestCancelledCampaignReturnsContextErrorAndLeavesNoKey(t *testing.T) {
	ctx := testContext(t)
	const name = "cancel"
	admin := cluster.Client(t)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))

	e := newElection(t, cluster.Client(t), name)
	cctx, cancel := context.WithCancel(ctx)
	errc := campaignAsync(cctx, e, "cancelled")
	awaitKeys(t, admin, name, 2)
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, errc, 10*time.Second, "a cancelled Campaign returns"), context.Canceled)
	assert.Equal(t, int64(1), keysOf(t, admin, name), "the cancelled candidate's key is left")
	assert.ErrorIs(t, e.Err(), election.ErrNotLeader)

	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	assert.ErrorIs(t, e.Campaign(dctx, "timed out"), context.DeadlineExceeded)
	assert.Equal(t, int64(1), keysOf(t, admin, name), "the timed-out candidate's key is left")
	require.NoError(t, leader.Resign(ctx))
	assert.Zero(t, keysOf(t, admin, name))
}

func TestCampaignWithAnExpiredSessionFailsAndLeavesNoKey(t *testing.T) {
	ctx := testContext(t)
	const name = "expired-session"
	cli := cluster.Client(t)
	s, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer s.Close()
	_, err = cli.Revoke(ctx, s.Lease())
	require.NoError(t, err)
	e := newElection(t, cli, name, election.WithSession(s))
	assert.ErrorIs(t, e.Campaign(ctx, "v"), election.ErrLost)
	assert.Zero(t, keysOf(t, cli, name))
	assert.Zero(t, e.Token())
}

func TestFailedResignKeepsLeadershipForARetry(t *testing.T) {
	ctx := testContext(t)
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
	assert.Equal(t, int64(1), keysOf(t, admin, name))
	require.NoError(t, e.Proclaim(ctx, "still leading"))

	require.NoError(t, e.Resign(ctx))
	assert.Zero(t, keysOf(t, admin, name))
	assert.ErrorIs(t, e.Resign(ctx), election.ErrNotLeader)
}

func TestIsOwnerGuardsWritesOnlyWhileLeading(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	e := newElection(t, cli, "owner")
	fencedPut := func(v string) bool {
		resp, err := cli.Txn(ctx).If(e.IsOwner()).Then(clientv3.OpPut("owner-data", v)).Commit()
		require.NoError(t, err)
		return resp.Succeeded
	}
	assert.False(t, fencedPut("before"), "IsOwner held before Campaign")
	require.NoError(t, e.Campaign(ctx, "v"))
	assert.True(t, fencedPut("leading"))
	require.NoError(t, e.Resign(ctx))
	assert.False(t, fencedPut("after"), "IsOwner held after Resign")
	resp, err := cli.Get(ctx, "owner-data")
	require.NoError(t, err)
	assert.Equal(t, "leading", string(resp.Kvs[0].Value))
}

func TestNestedNamesAreIndependent(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	names := []string{"a", "a/b", "ab", "a/", "a%2Fb", "/a"}
	leaders := make([]*election.Election, len(names))
	for i, name := range names {
		leaders[i] = newElection(t, cli, name)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		require.NoError(t, leaders[i].Campaign(cctx, name), "name %q blocked by another", name)
		cancel()
	}
	for i, e := range leaders {
		l, err := e.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, names[i], l.Value)
		assert.Equal(t, int64(1), keysOf(t, cli, names[i]), "name %q sees another's key", names[i])
		require.NoError(t, e.Resign(ctx))
	}
}

func TestBadInput(t *testing.T) {
	cli := cluster.Client(t)
	for _, tc := range []struct {
		desc string
		cli  *clientv3.Client
		name string
		opts []election.Option
		want error
	}{
		{"empty name", cli, "", nil, election.ErrInvalidName},
		{"long name", cli, strings.Repeat("x", 513), nil, election.ErrInvalidName},
		{"NUL", cli, "a\x00b", nil, election.ErrInvalidName},
		{"not UTF-8", cli, "a\xffb", nil, election.ErrInvalidName},
		{"nil client", nil, "n", nil, election.ErrInvalidOption},
		{"short TTL", cli, "n", []election.Option{election.WithTTL(time.Millisecond)}, election.ErrInvalidOption},
		{"nil option", cli, "n", []election.Option{nil}, election.ErrInvalidOption},
		{"nil session", cli, "n", []election.Option{election.WithSession(nil)}, election.ErrInvalidOption},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e, err := election.New(tc.cli, tc.name, tc.opts...)
			assert.ErrorIs(t, err, tc.want)
			assert.Nil(t, e)
		})
	}
}

func TestCallsWithoutLeadership(t *testing.T) {
	ctx := testContext(t)
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
