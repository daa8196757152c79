package primtest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// Keys counts the keys of name in etcd, under the default prefix.
func Keys(tb testing.TB, cli *clientv3.Client, name string) int64 {
	tb.Helper()
	return etcdtest.CountKeys(tb, cli, core.NamePrefix(name))
}

// AwaitKeys returns once name has n keys, woken by watch events rather than polling.
func AwaitKeys(tb testing.TB, cli *clientv3.Client, name string, n int64) {
	tb.Helper()
	etcdtest.AwaitKeys(tb, cli, core.NamePrefix(name), n)
}

// CountedClient is a client of c whose RPCs cnt counts, closed in tb.Cleanup.
func CountedClient(tb testing.TB, c *etcdtest.Cluster, cnt *rpcstat.Counter) *clientv3.Client {
	tb.Helper()
	cfg := c.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	cli, err := c.Open(cfg)
	if err != nil {
		tb.Fatalf("primtest: open a counted client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Make is the handle o opens on name over cli; it fails tb if New refuses.
func (o Open) Make(tb testing.TB, cli *clientv3.Client, name string, opts ...core.Option) Locker {
	tb.Helper()
	l, err := o(cli, name, opts...)
	if err != nil {
		tb.Fatalf("primtest: open %q: %v", name, err)
	}
	return l
}

// MustNew turns a package's New into a test's constructor, which fails tb when New refuses:
//
//	var newMutex = primtest.MustNew(mutex.New)
func MustNew[T any](newT func(*clientv3.Client, string, ...core.Option) (T, error)) func(testing.TB, *clientv3.Client, string, ...core.Option) T {
	return func(tb testing.TB, cli *clientv3.Client, name string, opts ...core.Option) T {
		tb.Helper()
		h, err := newT(cli, name, opts...)
		if err != nil {
			tb.Fatalf("primtest: new %q: %v", name, err)
		}
		return h
	}
}

// NextLeader returns the next Leader that obs, an Election's Observe, sends; it fails tb if
// none comes within 20 s or obs closes.
func NextLeader(tb testing.TB, obs <-chan election.Leader) election.Leader {
	tb.Helper()
	select {
	case l, ok := <-obs:
		if !ok {
			tb.Fatal("Observe closed its channel")
		}
		return l
	case <-time.After(20 * time.Second):
		tb.Fatal("Observe sent nothing within 20s")
		return election.Leader{}
	}
}
