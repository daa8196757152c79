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
	resp, err := cli.Get(testContext(t), core.NamePrefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Count
}

// awaitKeys returns once name has n keys, woken by watch events rather than polling.
func awaitKeys(t *testing.T, cli *clientv3.Client, name string, n int64) {
	t.Helper()
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), n)
}

// revision is the cluster's current revision: unchanged means nothing was written.
func revision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(testContext(t), "\x00")
	require.NoError(t, err)
	return resp.Header.Revision
}

// within fails the test unless ch is closed or yields within d.
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
		var zero T
		return zero
	}
}
