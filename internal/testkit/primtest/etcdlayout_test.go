package primtest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// etcdNames are names of the forms etcd's documentation uses, with '/', which our default
// layout escapes.
var etcdNames = []string{"/my-lock/", "jobs/nightly"}

func etcdSession(t *testing.T) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// awaitEtcdKeys returns once name, laid out as etcd lays it out, has n keys.
func awaitEtcdKeys(t *testing.T, name string, n int64) {
	t.Helper()
	etcdtest.AwaitKeys(t, cluster.Client(t), name+"/", n)
}

// TestEtcdLayoutExcludesEtcdsMutexBothWays: with WithEtcdLayout, our Mutex and etcd's
// concurrency.Mutex on a name with '/' exclude each other, both ways; without it they do not
// (the default escapes the name), which is why the option is there.
func TestEtcdLayoutExcludesEtcdsMutexBothWays(t *testing.T) {
	ctx := etcdtest.Context(t)
	for _, name := range etcdNames {
		t.Run(name, func(t *testing.T) {
			ours, err := mutex.New(cluster.Client(t), name, mutex.WithEtcdLayout())
			require.NoError(t, err)
			theirs := concurrency.NewMutex(etcdSession(t), name)

			require.NoError(t, ours.Lock(ctx))
			assert.ErrorIs(t, theirs.TryLock(ctx), concurrency.ErrLocked, "etcd's Mutex under our hold")
			locked := etcdtest.Async(func() error { return theirs.Lock(ctx) })
			awaitEtcdKeys(t, name, 2)
			etcdtest.Pending(t, locked, "etcd's Lock under our hold")
			require.NoError(t, ours.Unlock(ctx))
			require.NoError(t, etcdtest.Within(t, locked, 10*time.Second, "etcd's Lock after our Unlock"))

			snap, err := admin.Status(ctx, cluster.Client(t), []string{name}, admin.EtcdLayout())
			require.NoError(t, err)
			require.Len(t, snap.Names[0].Queue, 1, "status of the name in etcd's layout")
			assert.Equal(t, theirs.Key(), snap.Names[0].Queue[0].Key)
			assert.Equal(t, admin.StateHolds, snap.Names[0].Queue[0].State)
			assert.ErrorIs(t, ours.TryLock(ctx), mutex.ErrLocked, "ours under etcd's hold")
			oursLocked := etcdtest.Async(func() error { return ours.Lock(ctx) })
			awaitEtcdKeys(t, name, 2)
			etcdtest.Pending(t, oursLocked, "our Lock under etcd's hold")
			require.NoError(t, theirs.Unlock(ctx))
			require.NoError(t, etcdtest.Within(t, oursLocked, 10*time.Second, "our Lock after etcd's Unlock"))

			escaped, err := mutex.New(cluster.Client(t), name)
			require.NoError(t, err)
			require.NoError(t, escaped.TryLock(ctx), "the default layout is another name")
			require.NoError(t, escaped.Unlock(ctx))
			require.NoError(t, ours.Unlock(ctx))
		})
	}
}

// TestEtcdLayoutSharesEtcdsElectionBothWays: with WithEtcdLayout, etcd's Election sees our
// leader and waits for it, and ours sees and waits for etcd's.
func TestEtcdLayoutSharesEtcdsElectionBothWays(t *testing.T) {
	ctx := etcdtest.Context(t)
	for _, name := range etcdNames {
		t.Run(name, func(t *testing.T) {
			ours, err := election.New(cluster.Client(t), name, election.WithEtcdLayout())
			require.NoError(t, err)
			theirs := concurrency.NewElection(etcdSession(t), name)

			require.NoError(t, ours.Campaign(ctx, "ours"))
			leader, err := theirs.Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, "ours", string(leader.Kvs[0].Value), "etcd's Election sees our leader")
			won := etcdtest.Async(func() error { return theirs.Campaign(ctx, "theirs") })
			awaitEtcdKeys(t, name, 2)
			etcdtest.Pending(t, won, "etcd's Campaign under our leader")
			require.NoError(t, ours.Resign(ctx))
			require.NoError(t, etcdtest.Within(t, won, 10*time.Second, "etcd's Campaign after our Resign"))

			l, err := ours.Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, "theirs", l.Value, "ours sees etcd's leader")
			oursWon := etcdtest.Async(func() error { return ours.Campaign(ctx, "ours") })
			awaitEtcdKeys(t, name, 2)
			etcdtest.Pending(t, oursWon, "our Campaign under etcd's leader")
			require.NoError(t, theirs.Resign(ctx))
			require.NoError(t, etcdtest.Within(t, oursWon, 10*time.Second, "our Campaign after etcd's Resign"))
			require.NoError(t, ours.Resign(ctx))
		})
	}
}

// TestEtcdLayoutTakesTurnsWithEtcdsRecipeRWMutex: with WithEtcdLayout, our writer excludes
// the recipe's reader and writer, and the recipe's writer ours, on names with '/'.
func TestEtcdLayoutTakesTurnsWithEtcdsRecipeRWMutex(t *testing.T) {
	ctx := etcdtest.Context(t)
	for _, name := range etcdNames {
		t.Run(name, func(t *testing.T) {
			ours, err := rwmutex.New(cluster.Client(t), name, rwmutex.WithEtcdLayout())
			require.NoError(t, err)
			theirs := recipe.NewRWMutex(etcdSession(t), name)

			require.NoError(t, ours.Lock(ctx))
			rlocked := etcdtest.Async(theirs.RLock)
			awaitEtcdKeys(t, name, 2)
			etcdtest.Pending(t, rlocked, "the recipe's RLock under our write hold")
			require.NoError(t, ours.Unlock(ctx))
			require.NoError(t, etcdtest.Within(t, rlocked, 10*time.Second, "the recipe's RLock after our Unlock"))
			require.NoError(t, theirs.RUnlock())

			require.NoError(t, theirs.Lock())
			assert.ErrorIs(t, ours.TryRLock(ctx), rwmutex.ErrLocked, "our TryRLock under the recipe's writer")
			locked := etcdtest.Async(func() error { return ours.Lock(ctx) })
			awaitEtcdKeys(t, name, 2)
			etcdtest.Pending(t, locked, "our Lock under the recipe's writer")
			require.NoError(t, theirs.Unlock())
			require.NoError(t, etcdtest.Within(t, locked, 10*time.Second, "our Lock after the recipe's Unlock"))
			require.NoError(t, ours.Unlock(ctx))
			resp, err := cluster.Client(t).Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			require.NoError(t, err)
			assert.Zero(t, resp.Count)
		})
	}
}
