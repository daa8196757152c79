package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func newElection(t *testing.T, cli *clientv3.Client, name string, opts ...election.Option) *election.Election {
	t.Helper()
	e, err := election.New(cli, name, opts...)
	require.NoError(t, err)
	return e
}

// campaignAsync starts a Campaign and returns where its result arrives.
func campaignAsync(ctx context.Context, e *election.Election, value string) <-chan error {
	return etcdtest.Async(func() error { return e.Campaign(ctx, value) })
}

// leaderLease is the lease of the name's first key.
func leaderLease(t *testing.T, cli *clientv3.Client, name string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithFirstCreate()...)
	require.NoError(t, err)
	require.NotEmpty(t, resp.Kvs, "no leader key")
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// next returns the next Leader obs yields, failing the test if none comes within 20 s or
// the channel closes.
func next(t *testing.T, obs <-chan election.Leader) election.Leader {
	t.Helper()
	select {
	case l, ok := <-obs:
		require.True(t, ok, "Observe closed its channel")
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("Observe sent nothing within 20s")
		return election.Leader{}
	}
}
