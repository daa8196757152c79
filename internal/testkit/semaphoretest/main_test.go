package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/semaphore"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newSemaphore(t *testing.T, cli *clientv3.Client, name string, limit int, opts ...semaphore.Option) *semaphore.Semaphore {
	t.Helper()
	s, err := semaphore.New(cli, name, limit, opts...)
	require.NoError(t, err)
	return s
}

// permitPrefix is where the permits of name are: every key but the limit record.
func permitPrefix(name string) string { return core.NamePrefix(name) + "permit/" }

// permitsOf counts the permit keys of name in etcd, holders and waiters.
func permitsOf(t *testing.T, cli *clientv3.Client, name string) int64 {
	t.Helper()
	return etcdtest.CountKeys(t, cli, permitPrefix(name))
}

// awaitPermits returns once name has n permit keys, woken by watch events rather than polling.
func awaitPermits(t *testing.T, cli *clientv3.Client, name string, n int64) {
	t.Helper()
	etcdtest.AwaitKeys(t, cli, permitPrefix(name), n)
}

// acquireAsync starts an Acquire and returns where its outcome arrives.
func acquireAsync(ctx context.Context, s *semaphore.Semaphore) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := s.Acquire(ctx)
		ch <- acquired{p, err}
	}()
	return ch
}

type acquired struct {
	p   *semaphore.Permit
	err error
}
