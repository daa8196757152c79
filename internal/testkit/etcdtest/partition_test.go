package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// cutOff is how long the partitioned member is watched: longer than rafthttp's 5 s
// connection read timeout, after which its peers reconnect, so that a partition that leaks
// through new connections would show.
const cutOff = 8 * time.Second

// TestPartitionedLeaderStopsTakingPart partitions the leader from its peers: the others elect
// a new leader and take writes; the old one loses sight of any leader and, for as long as the
// partition lasts, serves no linearizable read and renews no lease; healed, it catches up.
func TestPartitionedLeaderStopsTakingPart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, err := etcdtest.NewEmbedded(3, etcdtest.WithPeerProxies())
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old, err := c.Leader(ctx)
	require.NoError(t, err)
	clients := make([]*clientv3.Client, c.Size())
	for i := range clients {
		clients[i] = memberClient(t, c, i)
	}
	put(ctx, t, clients[old], "etcdtest/before", "1")
	lease, err := clients[old].Grant(ctx, 60)
	require.NoError(t, err)
	oldID := idOf(ctx, t, clients[old])

	c.Partition(old)
	require.True(t, c.Partitioned(old))
	start := time.Now()
	others := []int{(old + 1) % 3, (old + 2) % 3}
	awaitStatus(ctx, t, clients, others, func(_, lead uint64) bool { return lead != 0 && lead != oldID })
	t.Logf("the majority elected a new leader in %v", time.Since(start))
	put(ctx, t, clients[others[0]], "etcdtest/during", "2")
	awaitStatus(ctx, t, clients, []int{old}, func(_, lead uint64) bool { return lead == 0 })
	t.Logf("the old leader sees no leader after %v", time.Since(start))

	for deadline := time.Now().Add(cutOff); time.Now().Before(deadline); {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		resp, err := clients[old].Get(rctx, "etcdtest/during")
		_, kerr := clients[old].KeepAliveOnce(rctx, lease.ID)
		rcancel()
		require.Error(t, err, "linearizable read through the partitioned member %v after the cut: %v", time.Since(start), resp)
		require.Error(t, kerr, "lease renewed through the partitioned member %v after the cut", time.Since(start))
	}

	c.Heal(old)
	require.False(t, c.Partitioned(old))
	healed := time.Now()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		resp, err := clients[old].Get(rctx, "etcdtest/during")
		rcancel()
		if err == nil {
			require.Len(t, resp.Kvs, 1)
			assert.Equal(t, "2", string(resp.Kvs[0].Value))
			break
		}
		require.NoError(t, ctx.Err(), "the healed member never served a linearizable read: %v", err)
	}
	t.Logf("the healed member served a linearizable read after %v", time.Since(healed))
}

// memberClient is a client of member i alone.
func memberClient(t *testing.T, c *etcdtest.Cluster, i int) *clientv3.Client {
	cfg := c.ClientConfig()
	cfg.Endpoints = []string{c.MemberEndpoint(i)}
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// idOf is the member ID of the only endpoint of cli.
func idOf(ctx context.Context, t *testing.T, cli *clientv3.Client) uint64 {
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	require.NoError(t, err)
	return st.Header.MemberId
}

// awaitStatus waits until every member in which reports a (self, leader) pair that ok
// accepts.
func awaitStatus(ctx context.Context, t *testing.T, clients []*clientv3.Client, which []int, ok func(self, lead uint64) bool) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		all := true
		for _, i := range which {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := clients[i].Status(sctx, clients[i].Endpoints()[0])
			cancel()
			all = all && err == nil && ok(st.Header.MemberId, st.Leader)
		}
		if all {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("members %v never reached the awaited state", which)
		}
	}
}
