package primtest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// A contest is a name of one test's own that k's First holds, as the admin client sees it.
type contest struct {
	t     *testing.T
	k     primtest.Kind
	name  string
	admin *clientv3.Client
	first primtest.Locker
	held  int64 // the name's keys while First holds
}

// hold opens First on "<what>-<kind>" on a client of its own and takes it with take
// (primtest.Locker.Lock or TryLock).
func hold(ctx context.Context, t *testing.T, k primtest.Kind, what string, take func(primtest.Locker, context.Context) error) *contest {
	t.Helper()
	c := &contest{t: t, k: k, name: what + "-" + k.Name, admin: cluster.Client(t)}
	c.first = k.First.Make(t, cluster.Client(t), c.name)
	require.NoError(t, take(c.first, ctx))
	c.held = c.keys()
	return c
}

// second opens a Second handle on the name, on a client of its own.
func (c *contest) second() primtest.Locker { return c.k.Second.Make(c.t, cluster.Client(c.t), c.name) }

// keys counts the name's keys of holds and waiters.
func (c *contest) keys() int64 { return etcdtest.CountKeys(c.t, c.admin, c.k.Keys(c.name)) }

// awaitWaiters returns once n waiters have their keys beside First's.
func (c *contest) awaitWaiters(n int64) { etcdtest.AwaitKeys(c.t, c.admin, c.k.Keys(c.name), c.held+n) }
