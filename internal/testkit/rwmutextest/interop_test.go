package rwmutex_test

import (
	"sync"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
)

// TestTakesTurnsWithEtcdRecipe: on a name without '/' and '%', our keys are those of etcd's
// recipe.RWMutex, so each side's writer excludes the other side's readers and writers, and
// each side's readers wait for the other side's writer, both ways.
func TestTakesTurnsWithEtcdRecipe(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "recipe-interop"
	admin := cluster.Client(t)
	sess, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer sess.Close()
	theirs := recipe.NewRWMutex(sess, name)
	ours := newRW(t, cluster.Client(t), name)

	// Our writer, their reader.
	require.NoError(t, ours.Lock(ctx))
	rlocked := etcdtest.Async(theirs.RLock)
	primtest.AwaitKeys(t, admin, name, 2)
	etcdtest.Pending(t, rlocked, "recipe's RLock under our write hold")
	require.NoError(t, ours.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, rlocked, 5*time.Second, "recipe's RLock after our Unlock"))

	// Their reader, our writer; our reader beside theirs.
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return ours.RLock(ctx) }), 5*time.Second, "our RLock beside recipe's reader"))
	require.NoError(t, ours.RUnlock(ctx))
	locked := etcdtest.Async(func() error { return ours.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	etcdtest.Pending(t, locked, "our Lock beside recipe's reader")
	require.NoError(t, theirs.RUnlock())
	require.NoError(t, etcdtest.Within(t, locked, 5*time.Second, "our Lock after recipe's RUnlock"))

	// Our writer, their writer.
	wlocked := etcdtest.Async(theirs.Lock)
	primtest.AwaitKeys(t, admin, name, 2)
	etcdtest.Pending(t, wlocked, "recipe's Lock under our write hold")
	require.NoError(t, ours.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, wlocked, 5*time.Second, "recipe's Lock after our Unlock"))

	// Their writer, our reader and writer.
	rlocked = etcdtest.Async(func() error { return ours.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	etcdtest.Pending(t, rlocked, "our RLock under recipe's write hold")
	require.NoError(t, theirs.Unlock())
	require.NoError(t, etcdtest.Within(t, rlocked, 5*time.Second, "our RLock after recipe's Unlock"))
	require.NoError(t, ours.RUnlock(ctx))
	require.Zero(t, primtest.Keys(t, admin, name))
}

// TestUpgradableReadBesideEtcdRecipe: our upgradable read holds beside the recipe's reader
// ahead of it, and the recipe's reader and writer behind it take it for a writer and wait;
// Upgrade waits for the recipe's reader ahead, and the recipe's writer comes in after it.
func TestUpgradableReadBesideEtcdRecipe(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "recipe-upgradable"
	admin := cluster.Client(t)
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(cluster.Client(t))
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	reader := recipe.NewRWMutex(session(), name)
	require.NoError(t, reader.RLock())
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return u.ULock(ctx) }), served, "ULock beside the recipe's reader"))
	// The recipe weighs only keys whose mod revision is below its own key's creation: its
	// writer takes our key for a writer only if it reads the name before the upgrade changes
	// the key (not safe otherwise: see docs/guarantees.md). So the upgrade starts once the
	// writer's first read was answered.
	inj := &etcdtest.Injector{}
	wread := make(chan struct{})
	var once sync.Once
	inj.Add(etcdtest.Rule{Method: "Range", Action: etcdtest.Delay, Answered: func() { once.Do(func() { close(wread) }) }})
	ws, err := concurrency.NewSession(inj.Client(t, cluster))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ws.Close() })
	writer, late := recipe.NewRWMutex(ws, name), recipe.NewRWMutex(session(), name)
	wlocked := etcdtest.Async(writer.Lock)
	primtest.AwaitKeys(t, admin, name, 3)
	etcdtest.Within(t, wread, served, "the recipe's writer's read")
	rlocked := etcdtest.Async(late.RLock)
	primtest.AwaitKeys(t, admin, name, 4)

	upgraded := etcdtest.Async(func() error { return u.Upgrade(ctx) })
	waits(t, upgraded, "Upgrade beside the recipe's reader")
	waits(t, rlocked, "the recipe's RLock behind an upgradable read")
	require.NoError(t, reader.RUnlock())
	require.NoError(t, etcdtest.Within(t, upgraded, served, "Upgrade once the recipe's reader left"))
	waits(t, wlocked, "the recipe's Lock behind the upgraded hold")
	require.NoError(t, u.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, wlocked, served, "the recipe's Lock"))
	require.NoError(t, writer.Unlock())
	require.NoError(t, etcdtest.Within(t, rlocked, served, "the recipe's RLock"))
	require.NoError(t, late.RUnlock())
	assert.Zero(t, primtest.Keys(t, admin, name))
}
