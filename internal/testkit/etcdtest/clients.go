package etcdtest

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ClientOf is a client of endpoints, with no credentials, closed in tb.Cleanup.
func ClientOf(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	return clientOfConfig(tb, clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// clientOfConfig is a client on cfg, closed in tb.Cleanup.
func clientOfConfig(tb testing.TB, cfg clientv3.Config) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatalf("etcd client of %v: %v", cfg.Endpoints, err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// PinnedClient is a client of member i alone, with the credentials of ClientConfig.
func PinnedClient(tb testing.TB, c *Cluster, i int) *clientv3.Client {
	tb.Helper()
	cfg := c.ClientConfig()
	cfg.Endpoints = []string{c.MemberEndpoint(i)}
	return c.openFor(tb, cfg)
}

// SpreadClient is a client of every member, starting with member i, with the credentials of
// ClientConfig. Its requests are balanced over the members, so a waiter's Txn and its watch
// are often served by different members, and the watch's member may not have applied the
// Txn yet.
func SpreadClient(tb testing.TB, c *Cluster, i int) *clientv3.Client {
	tb.Helper()
	eps := c.Endpoints()
	i %= len(eps)
	cfg := c.ClientConfig()
	cfg.Endpoints = append(eps[i:], eps[:i]...)
	return c.openFor(tb, cfg)
}

// writeRetryPause is how long BackgroundWrites waits before it writes again after a
// transient error.
const writeRetryPause = 50 * time.Millisecond

// BackgroundWrites puts 256 KiB values under prefix in a loop until the returned stop is
// called (which waits for it) or ctx ends: each takes the followers a while to apply, so
// they apply behind the leader. A write that fails only because etcd cannot answer now (no
// leader, a member stopping or out of reach) is tried again after 50 ms; any other error
// fails tb and ends the loop.
func BackgroundWrites(ctx context.Context, tb testing.TB, cli *clientv3.Client, prefix string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	value := strings.Repeat("x", 256<<10)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, err := cli.Put(ctx, prefix+strconv.Itoa(i%8), value)
			switch {
			case err == nil, ctx.Err() != nil:
			case transient(err):
				pause(ctx, writeRetryPause)
			default:
				tb.Errorf("background write: %v", err)
				return
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// pause returns after d, or sooner if ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// transient reports whether err says only that etcd could not answer now: etcd's own
// "no leader", "leader changed" or "request timed out", or a connection to a member that
// failed (its gRPC code is Unavailable either way).
func transient(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable
}

// openFor is c.Open(cfg), closed in tb.Cleanup; it fails tb if it cannot open one.
func (c *Cluster) openFor(tb testing.TB, cfg clientv3.Config) *clientv3.Client {
	tb.Helper()
	cli, err := c.Open(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// ProxiedClient returns a client of endpoint i alone, with the credentials of ClientConfig,
// whose traffic goes through a Proxy that the test can black-hole. The client is closed
// before the proxy, in tb.Cleanup.
func ProxiedClient(tb testing.TB, c *Cluster, i int) (*clientv3.Client, *Proxy) {
	tb.Helper()
	target, err := url.Parse(c.Endpoints()[i])
	if err != nil {
		tb.Fatal(err)
	}
	proxy, err := NewProxy(*target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { proxy.Close() })
	through := proxy.URL()
	cfg := c.ClientConfig()
	cfg.Endpoints = []string{through.String()}
	return c.openFor(tb, cfg), proxy
}
