package core_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestEndpointsOfTwoClustersFailTheAcquisitionAndLeaveNoLease: a client given a member of
// each of two clusters takes its requests to them in turn, so the lease its Grant got from
// one is "not found" by the other when its Txn goes there. The acquisition fails within
// seconds with ErrMixedClusters naming both clusters' IDs, and neither cluster keeps a lease.
func TestEndpointsOfTwoClustersFailTheAcquisitionAndLeaveNoLease(t *testing.T) {
	etcdtest.OwnMembers(t)
	cliA, cliB := clusterOfOne(t), clusterOfOne(t)
	ids := []string{clusterID(t, cliA), clusterID(t, cliB)}
	require.NotEqual(t, ids[0], ids[1])
	cli := etcdtest.ClientOf(t, cliA.Endpoints()[0], cliB.Endpoints()[0])
	awaitAnswersFrom(t, cli, ids)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := queue(t, cli, "two-clusters").Acquire(ctx, exclusive, nil)
	require.Error(t, err)
	t.Log(err)
	assert.ErrorIs(t, err, core.ErrMixedClusters)
	assert.NotErrorIs(t, err, core.ErrLost, "a loss would have the command wait again")
	for _, id := range ids {
		assert.Contains(t, err.Error(), id)
	}
	assert.Less(t, time.Since(start), 10*time.Second, "not within a few tries")
	for _, c := range []*clientv3.Client{cliA, cliB} {
		leases, err := c.Leases(testContext(t))
		require.NoError(t, err)
		assert.Empty(t, leases.Leases, "a lease left on %v", c.Endpoints())
	}
}

// clusterOfOne starts a cluster of one embedded member, closed in t.Cleanup, and returns a
// client of it.
func clusterOfOne(t *testing.T) *clientv3.Client {
	t.Helper()
	c, err := etcdtest.NewEmbedded(1)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.Client(t)
}

// clusterID is the ID of cli's cluster as etcd prints it: hex.
func clusterID(t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	resp, err := cli.Get(testContext(t), "x", clientv3.WithCountOnly())
	require.NoError(t, err)
	return fmt.Sprintf("%x", resp.Header.ClusterId)
}

// awaitAnswersFrom reads through cli until answers have come from each cluster of ids: its
// balancer has a connection to each and takes them in turn from then on. (etcd's 3.6
// client, on gRPC 1.71, may send many reads to the first connection before the second is
// ready.)
func awaitAnswersFrom(t *testing.T, cli *clientv3.Client, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		resp, err := cli.Get(testContext(t), "x", clientv3.WithCountOnly())
		if err == nil {
			seen[fmt.Sprintf("%x", resp.Header.ClusterId)] = true
		}
		return len(seen) == len(ids)
	}, 10*time.Second, time.Millisecond, "answered by %v only, not by each of %v", seen, ids)
}
