package etcdtest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ClientOf is a client of endpoints, closed in tb.Cleanup.
func ClientOf(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcd client of %v: %v", endpoints, err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// PinnedClient is a client of member i alone.
func PinnedClient(tb testing.TB, c *Cluster, i int) *clientv3.Client {
	tb.Helper()
	return ClientOf(tb, c.MemberEndpoint(i))
}

// SpreadClient is a client of every member, starting with member i. Its requests are
// balanced over the members, so a waiter's Txn and its watch are often served by different
// members, and the watch's member may not have applied the Txn yet.
func SpreadClient(tb testing.TB, c *Cluster, i int) *clientv3.Client {
	tb.Helper()
	eps := c.Endpoints()
	i %= len(eps)
	return ClientOf(tb, append(eps[i:], eps[:i]...)...)
}

// BackgroundWrites puts 256 KiB values under prefix in a loop until the returned stop is
// called (which waits for it) or ctx ends: each takes the followers a while to apply, so
// they apply behind the leader.
func BackgroundWrites(ctx context.Context, tb testing.TB, cli *clientv3.Client, prefix string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	value := strings.Repeat("x", 256<<10)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, err := cli.Put(ctx, prefix+strconv.Itoa(i%8), value)
			if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
				tb.Errorf("background write: %v", err)
				return
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}
