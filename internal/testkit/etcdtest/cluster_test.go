package etcdtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func TestSingleMemberPutGet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := cluster.Client(t)
	_, err := cli.Put(ctx, "etcdtest/single", "v")
	require.NoError(t, err)
	resp, err := cli.Get(ctx, "etcdtest/single")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	assert.Equal(t, "v", string(resp.Kvs[0].Value))
}

// TestExternal points New at the running cluster through ETCD_ENDPOINTS, without schemes.
func TestExternal(t *testing.T) {
	var hosts []string
	for _, ep := range cluster.Endpoints() {
		hosts = append(hosts, strings.TrimPrefix(ep, "http://"))
	}
	t.Setenv("ETCD_ENDPOINTS", strings.Join(hosts, ","))
	ext, err := etcdtest.New(3)
	require.NoError(t, err)
	defer ext.Close()
	assert.True(t, ext.External())
	assert.Equal(t, cluster.Endpoints(), ext.Endpoints())
	assert.Equal(t, cluster.Size(), ext.Size())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Whichever member leads: the same one, seen through Status calls and through the
	// cluster's own view.
	leader, err := ext.Leader(ctx)
	require.NoError(t, err)
	want, err := cluster.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, want, leader)

	// Its clients work inside a prefix of the run's own, which Close deletes.
	prefix := ext.Prefix()
	require.True(t, strings.HasPrefix(prefix, etcdtest.RunPrefix), "prefix %q", prefix)
	other, err := etcdtest.New(3)
	require.NoError(t, err)
	defer other.Close()
	assert.NotEqual(t, prefix, other.Prefix(), "two runs share a prefix")
	_, err = ext.Client(t).Put(ctx, "etcdtest/external", "v")
	require.NoError(t, err)
	plain := etcdtest.ClientOf(t, cluster.Endpoints()...)
	resp, err := plain.Get(ctx, prefix+"etcdtest/external")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the key is not under the run's prefix")
	assert.Zero(t, etcdtest.CountKeys(t, other.Client(t), "etcdtest/external"), "another run sees the key")
	assert.Panics(t, func() { ext.Kill(0) })
	assert.Panics(t, func() { _ = ext.MemberEndpoint(0) })

	ext.Close()
	assert.Zero(t, etcdtest.CountKeys(t, plain, prefix), "Close left keys under the run's prefix")
}

// TestThreeMembers kills the leader, writes without it, restarts it and sees it catch up,
// then stops and restarts another member.
func TestThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	start := time.Now()
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()
	t.Logf("started in %v", time.Since(start))
	require.Equal(t, 3, c.Size())
	require.False(t, c.External())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := c.Client(t)
	put(ctx, t, cli, "etcdtest/before", "1")

	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	step := time.Now()
	c.Kill(leader)
	t.Logf("killed leader %d in %v", leader, time.Since(step))

	step = time.Now()
	put(ctx, t, cli, "etcdtest/after-kill", "2")
	t.Logf("wrote without the old leader after %v", time.Since(step))
	newLeader, err := c.Leader(ctx)
	require.NoError(t, err)
	require.NotEqual(t, leader, newLeader)

	step = time.Now()
	require.NoError(t, c.Restart(leader))
	t.Logf("restarted %d in %v", leader, time.Since(step))
	seesOn(ctx, t, c, leader, "etcdtest/after-kill", "2")

	other := (leader + 1) % 3
	step = time.Now()
	c.Stop(other)
	t.Logf("stopped %d in %v", other, time.Since(step))
	put(ctx, t, cli, "etcdtest/after-stop", "3")
	require.NoError(t, c.Restart(other))
	require.Error(t, c.Restart(other), "restarting a running member")
	seesOn(ctx, t, c, other, "etcdtest/after-stop", "3")
	require.NoError(t, c.WaitLeader(ctx))

	step = time.Now()
	c.Close()
	t.Logf("closed in %v", time.Since(step))
	require.Error(t, c.Restart(other), "restarting a closed cluster")
}

// put writes key, retrying for up to 20 s while the cluster elects a leader.
func put(ctx context.Context, t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		opCtx, opCancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Put(opCtx, key, value)
		opCancel()
		if err == nil {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("put %q: %v", key, err)
		}
	}
}

// seesOn waits up to 20 s for member i alone to serve key = value from its own store.
func seesOn(ctx context.Context, t *testing.T, c *etcdtest.Cluster, i int, key, value string) {
	t.Helper()
	cfg := c.ClientConfig()
	cfg.Endpoints = []string{c.MemberEndpoint(i)}
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := cli.Get(ctx, key, clientv3.WithSerializable())
		if err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == value {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("member %d never served %s=%s: %v, %v", i, key, value, resp, err)
		}
	}
}
