package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// The interop tests run ours beside etcd's concurrency.Election on one name without '/':
// both take the leader to be the first key created under "<name>/", so each sees the
// other's leader and waits for it.

func etcdElection(t *testing.T, name string) *concurrency.Election {
	t.Helper()
	s, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return concurrency.NewElection(s, name)
}

func TestEtcdElectionSeesOurLeaderAndWaitsForIt(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "interop-ours"
	ours := newElection(t, cluster.Client(t), name)
	require.NoError(t, ours.Campaign(ctx, "ours"))
	theirs := etcdElection(t, name)

	resp, err := theirs.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "ours", string(resp.Kvs[0].Value))
	assert.Equal(t, ours.Token(), resp.Kvs[0].CreateRevision)

	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs := theirs.Observe(octx)
	assert.Equal(t, "ours", string(etcdtest.Within(t, obs, 10*time.Second, "etcd's Observe").Kvs[0].Value))
	require.NoError(t, ours.Proclaim(ctx, "ours, proclaimed"))
	assert.Equal(t, "ours, proclaimed", string(etcdtest.Within(t, obs, 10*time.Second, "etcd's Observe").Kvs[0].Value))

	won := make(chan error, 1)
	go func() { won <- theirs.Campaign(ctx, "theirs") }()
	primtest.AwaitKeys(t, cluster.Client(t), name, 2)
	select {
	case err := <-won:
		t.Fatalf("etcd's Campaign returned while ours leads: %v", err)
	default:
	}
	require.NoError(t, ours.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, won, 10*time.Second, "etcd's Campaign after our Resign"))
	assert.Equal(t, "theirs", string(etcdtest.Within(t, obs, 10*time.Second, "etcd's Observe").Kvs[0].Value))
	require.NoError(t, theirs.Resign(ctx))
}

func TestOurCandidateWaitsForEtcdsLeaderAndSeesIt(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "interop-theirs"
	theirs := etcdElection(t, name)
	require.NoError(t, theirs.Campaign(ctx, "theirs"))

	ours := newElection(t, cluster.Client(t), name)
	l, err := ours.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "theirs", Token: theirs.Rev()}, l)
	obs := newElection(t, cluster.Client(t), name).Observe(ctx)
	assert.Equal(t, election.Leader{Value: "theirs", Token: theirs.Rev()}, primtest.NextLeader(t, obs))

	won := campaignAsync(ctx, ours, "ours")
	primtest.AwaitKeys(t, cluster.Client(t), name, 2)
	require.NoError(t, theirs.Proclaim(ctx, "theirs, proclaimed"))
	assert.Equal(t, election.Leader{Value: "theirs, proclaimed", Token: theirs.Rev()}, primtest.NextLeader(t, obs))
	select {
	case err := <-won:
		t.Fatalf("our Campaign returned while etcd's leads: %v", err)
	default:
	}
	require.NoError(t, theirs.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, won, 10*time.Second, "our Campaign after etcd's Resign"))
	assert.Equal(t, election.Leader{Value: "ours", Token: ours.Token()}, primtest.NextLeader(t, obs))
	l, err = ours.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "ours", Token: ours.Token()}, l)
	require.NoError(t, ours.Resign(ctx))
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))
}
