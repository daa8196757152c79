package securetest_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// namespaced is a new client of user tenant whose KV, Watcher and Lease see only the keys
// under tenantPrefix, with the prefix taken off: every request of a primitive on it lands
// under tenantPrefix, which is all the user's grant covers.
func namespaced(t *testing.T) *clientv3.Client {
	t.Helper()
	cli := cluster.ClientAs(t, tenantUser)
	etcdtest.Confine(cli, tenantPrefix)
	return cli
}

// TestNamespaceContention: two namespaced clients contend through every primitive, with no
// option, as on a client of the whole keyspace; the keys appear under the namespace to a
// plain client.
func TestNamespaceContention(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			name := "jobs/ns-" + k.Name
			contend(t, k, side{cli: namespaced(t)}, side{cli: namespaced(t)}, cluster.Client(t), name, tenantPrefix+core.NamePrefix(name))
		})
	}
}

// TestNamespaceMeetsWithPrefix: a handle on a namespaced client and one on a plain client
// with WithPrefix of the namespace are the same lock of the same name (the same keys): each
// waits for the other, in either order.
func TestNamespaceMeetsWithPrefix(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			name := "jobs/meet-" + k.Name
			inside := side{cli: namespaced(t)}
			outside := side{cluster.ClientAs(t, tenantUser), []core.Option{k.WithPrefix(tenantPrefix)}}
			keys := tenantPrefix + core.NamePrefix(name)
			contend(t, k, inside, outside, cluster.Client(t), name, keys)
			contend(t, k, outside, inside, cluster.Client(t), name, keys)
		})
	}
}

// TestNamespaceElection: Campaign, Proclaim, Leader, Observe and Resign of two candidates
// on namespaced clients.
func TestNamespaceElection(t *testing.T) {
	name := "jobs/ns-leader"
	runElection(t, namespaced(t), namespaced(t), cluster.Client(t), name, tenantPrefix+core.NamePrefix(name))
}

// TestNamespaceKeepsPlainNamesApart: the same name on a namespaced client and on a plain
// client without WithPrefix are two locks, held at once.
func TestNamespaceKeepsPlainNamesApart(t *testing.T) {
	ctx := etcdtest.Context(t)
	name := "jobs/apart"
	inside := primtest.OpenMutex.Make(t, namespaced(t), name)
	outside := primtest.OpenMutex.Make(t, cluster.Client(t), name)
	require.NoError(t, inside.Lock(ctx))
	require.NoError(t, outside.TryLock(ctx))
	require.NoError(t, inside.Unlock(ctx))
	require.NoError(t, outside.Unlock(ctx))
}
