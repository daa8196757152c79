package reentrant_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/etcdtest"
	"github.com/etcdsync/etcdsync/internal/rpcstat"
	"github.com/etcdsync/etcdsync/reentrant"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newMutex(t *testing.T, cli *clientv3.Client, name string, opts ...reentrant.Option) *reentrant.Mutex {
	t.Helper()
	m, err := reentrant.New(cli, name, opts...)
	require.NoError(t, err)
	return m
}

// keysOf returns the keys of name in etcd, in queue order (oldest first).
func keysOf(t *testing.T, cli *clientv3.Client, name string) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(testContext(t), core.NamePrefix(name), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	require.NoError(t, err)
	return resp.Kvs
}

// awaitKeys returns once name has n keys, woken by watch events rather than polling.
func awaitKeys(t *testing.T, cli *clientv3.Client, name string, n int64) {
	t.Helper()
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), n)
}

// countedClient is a client whose RPCs cnt counts.
func countedClient(t *testing.T, cnt *rpcstat.Counter) *clientv3.Client {
	t.Helper()
	cfg := cluster.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	cli, err := cluster.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// requests are the counts of requests to etcd, leaving out the streams a hold keeps open
// in the background (its key's watch, its lease's keep-alive).
func requests(c rpcstat.Counts) rpcstat.Counts {
	out := rpcstat.Counts{}
	for method, n := range c {
		if !strings.HasPrefix(method, "Watch") && !strings.HasPrefix(method, "LeaseKeepAlive") {
			out[method] = n
		}
	}
	return out
}
