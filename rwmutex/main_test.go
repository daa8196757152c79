package rwmutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/etcdtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newRW(t *testing.T, cli *clientv3.Client, name string, opts ...rwmutex.Option) *rwmutex.RWMutex {
	t.Helper()
	rw, err := rwmutex.New(cli, name, opts...)
	require.NoError(t, err)
	return rw
}

// keysOf counts the keys of name in etcd.
func keysOf(t *testing.T, cli *clientv3.Client, name string) int64 {
	t.Helper()
	return etcdtest.CountKeys(t, cli, core.NamePrefix(name))
}

// awaitKeys returns once name has n keys, woken by watch events rather than polling.
func awaitKeys(t *testing.T, cli *clientv3.Client, name string, n int64) {
	t.Helper()
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), n)
}
