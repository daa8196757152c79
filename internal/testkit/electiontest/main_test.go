package election_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

var newElection = primtest.MustNew(election.New)

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
