package securetest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// runElection walks an election of name through every call, a candidate on a and one on b:
// a campaigns and leads, b sees it by Leader and Observe, a proclaims a new value, b's
// campaign waits until a resigns, then b leads with a higher token, and resigns. At the end
// Observe has reported each change in order and no key is left under keys (as admin sees).
func runElection(t *testing.T, a, b, admin *clientv3.Client, name, keys string, opts ...core.Option) {
	t.Helper()
	ctx := etcdtest.Context(t)
	ea, err := election.New(a, name, opts...)
	require.NoError(t, err)
	eb, err := election.New(b, name, opts...)
	require.NoError(t, err)

	obs := eb.Observe(ctx)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs), "nobody leads at first")
	require.NoError(t, ea.Campaign(ctx, "a"))
	lead := primtest.NextLeader(t, obs)
	assert.Equal(t, election.Leader{Value: "a", Token: ea.Token()}, lead)
	got, err := eb.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, lead, got)

	require.NoError(t, ea.Proclaim(ctx, "a2"))
	assert.Equal(t, election.Leader{Value: "a2", Token: ea.Token()}, primtest.NextLeader(t, obs))

	campaigned := etcdtest.Async(func() error { return eb.Campaign(ctx, "b") })
	etcdtest.AwaitKeys(t, admin, keys, 2) // b in line: a's resignation hands over directly
	select {
	case err := <-campaigned:
		t.Fatalf("b leads while a does: %v", err)
	default:
	}
	require.NoError(t, ea.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, campaigned, served, "b leads once a resigned"))
	lead = primtest.NextLeader(t, obs)
	assert.Equal(t, election.Leader{Value: "b", Token: eb.Token()}, lead)
	assert.Greater(t, lead.Token, got.Token, "tokens rise")
	got, err = ea.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, lead, got)

	require.NoError(t, eb.Resign(ctx))
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs), "nobody leads at the end")
	_, err = eb.Leader(ctx)
	assert.ErrorIs(t, err, election.ErrNoLeader)
	assertNoLockKeys(t, admin, keys)
}

// TestTransferOutsideTheGrantLeavesTheLeaderLeading: a leader whose grant covers its
// election's keys alone cannot write the record of a handover beside them: Transfer is
// refused with ErrPermissionDenied, writes nothing, and the leader leads on.
func TestTransferOutsideTheGrantLeavesTheLeaderLeading(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	leader, err := election.New(cluster.ClientAs(t, nameUser), namedElection, election.WithPrefix(appPrefix))
	require.NoError(t, err)
	require.NoError(t, leader.Campaign(ctx, "leader"))
	other, err := election.New(cluster.ClientAs(t, appUser), namedElection, election.WithPrefix(appPrefix))
	require.NoError(t, err)
	won := etcdtest.Async(func() error { return other.Campaign(ctx, "other") })
	etcdtest.AwaitKeys(t, admin, appPrefix+core.NamePrefix(namedElection), 2)
	rev := etcdtest.Revision(t, admin)
	err = leader.Transfer(ctx, "other")
	assert.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
	etcdtest.NoWrites(t, admin, rev, "a refused transfer")
	require.NoError(t, leader.Err(), "the leader leads on")
	require.NoError(t, leader.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, won, 10*time.Second, "the other candidate"))
	require.NoError(t, other.Resign(ctx))
}
