package reentrant_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/reentrant"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

var newMutex = primtest.MustNew(reentrant.New)

// keysOf returns the keys of name in etcd, in queue order (oldest first).
func keysOf(t *testing.T, cli *clientv3.Client, name string) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	require.NoError(t, err)
	return resp.Kvs
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
