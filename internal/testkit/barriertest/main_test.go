package barrier_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fresh deletes what an earlier run (-count) left of name's barrier: its records.
func fresh(t testing.TB, name string) {
	t.Helper()
	_, err := cluster.Client(t).Delete(testContext(t), core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
}

// participants is the prefix of name's participants' keys.
func participants(name string) string { return core.NamePrefix(name) + "in/" }

// newBarrier returns a Barrier of n on name over a client of its own.
func newBarrier(t *testing.T, name string, n int, opts ...barrier.Option) *barrier.Barrier {
	t.Helper()
	b, err := barrier.New(cluster.Client(t), name, n, opts...)
	require.NoError(t, err)
	return b
}

// entering starts b's Enter once its key is the n-th participant's key of the name, so
// that participants enter in a known order.
func entering(t *testing.T, ctx context.Context, b *barrier.Barrier, name string, nth int64) <-chan error {
	t.Helper()
	errc := etcdtest.Async(func() error { return b.Enter(ctx) })
	etcdtest.AwaitKeys(t, cluster.Client(t), participants(name), nth)
	return errc
}
