package rwmutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/rwmutex"
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
// ahead of it, and the recipe's writer behind it takes it for a writer and waits; Upgrade
// waits for the recipe's reader ahead, and the recipe's writer that comes after it waits
// for the upgraded hold.
func TestUpgradableReadBesideEtcdRecipe(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "recipe-upgradable"
	admin := cluster.Client(t)
	reader := recipe.NewRWMutex(recipeSession(t), name)
	require.NoError(t, reader.RLock())
	u := newRW(t, cluster.Client(t), name)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return u.ULock(ctx) }), served, "ULock beside the recipe's reader"))
	upgraded := etcdtest.Async(func() error { return u.Upgrade(ctx) })
	waits(t, upgraded, "Upgrade beside the recipe's reader")
	require.NoError(t, reader.RUnlock())
	require.NoError(t, etcdtest.Within(t, upgraded, served, "Upgrade once the recipe's reader left"))
	writer, late := recipe.NewRWMutex(recipeSession(t), name), recipe.NewRWMutex(recipeSession(t), name)
	wlocked := etcdtest.Async(writer.Lock)
	primtest.AwaitKeys(t, admin, name, 2)
	rlocked := etcdtest.Async(late.RLock)
	primtest.AwaitKeys(t, admin, name, 3)
	waits(t, wlocked, "the recipe's Lock behind the upgraded hold")
	waits(t, rlocked, "the recipe's RLock behind the upgraded hold")
	require.NoError(t, u.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, wlocked, served, "the recipe's Lock"))
	require.NoError(t, writer.Unlock())
	require.NoError(t, etcdtest.Within(t, rlocked, served, "the recipe's RLock"))
	require.NoError(t, late.RUnlock())
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestNoChangeInPlaceOverARecipeWaiter: while a waiter of etcd's recipe.RWMutex is queued
// behind a hold, a change of the hold in place is refused with ErrInvalidOption and writes
// nothing: the recipe weighs keys by their mod revision, and would not see the key once
// changed (a race in CI served its writer beside an upgraded hold). The hold is as it was
// (the write hold after Downgrade, the upgradable read after Upgrade), and the recipe's
// writer waits for it.
func TestNoChangeInPlaceOverARecipeWaiter(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "recipe-behind"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	for _, c := range []struct {
		what   string
		take   func(context.Context) error
		change func(context.Context) error
		leave  func(context.Context) error
	}{
		{"Downgrade", rw.Lock, rw.Downgrade, rw.Unlock},
		{"Upgrade", rw.ULock, rw.Upgrade, rw.UUnlock},
	} {
		require.NoError(t, c.take(ctx), c.what)
		writer := recipe.NewRWMutex(recipeSession(t), name)
		wlocked := etcdtest.Async(writer.Lock)
		primtest.AwaitKeys(t, admin, name, 2)
		since := etcdtest.Revision(t, admin)
		assert.ErrorIs(t, c.change(ctx), rwmutex.ErrInvalidOption, c.what)
		etcdtest.NoWrites(t, admin, since, c.what+" over the recipe's waiter")
		waits(t, wlocked, "the recipe's Lock behind a hold that did not change")
		require.NoError(t, c.leave(ctx), c.what)
		require.NoError(t, etcdtest.Within(t, wlocked, served, "the recipe's Lock"), c.what)
		require.NoError(t, writer.Unlock())
	}
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// recipeSession is a session of etcd's concurrency package on a client of its own.
func recipeSession(t *testing.T) *concurrency.Session {
	s, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}
