package rwmutex_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// A change in place under faults: its Txn answered late, applied without an answer, never
// sent. Whatever etcd did, the handle holds the weaker hold (a read after a Downgrade, an
// upgradable read after an Upgrade that did not return nil), no writer is served beside a
// hold, and nothing is left behind.

// changeSetup is a writer whose client has inj holding the lock, a reader and then a writer
// queued behind it on clients of their own.
type changeSetup struct {
	w, r, w2 *rwmutex.RWMutex
	rlocked  <-chan error
	w2locked <-chan error
	key      string
	admin    *clientv3.Client
	name     string
}

func setUpChange(t *testing.T, name string, inj *etcdtest.Injector) changeSetup {
	ctx := etcdtest.Context(t)
	s := changeSetup{admin: cluster.Client(t), name: name}
	s.w = newRW(t, inj.Client(t, cluster), name)
	require.NoError(t, s.w.Lock(ctx))
	s.key = s.w.Key()
	s.r = newRW(t, cluster.Client(t), name)
	s.rlocked = etcdtest.Async(func() error { return s.r.RLock(ctx) })
	primtest.AwaitKeys(t, s.admin, name, 2)
	s.w2 = newRW(t, cluster.Client(t), name)
	s.w2locked = etcdtest.Async(func() error { return s.w2.Lock(ctx) })
	primtest.AwaitKeys(t, s.admin, name, 3)
	return s
}

// finish, once the reader is served beside the downgraded hold, releases that hold: the
// second writer is served once the reader leaves too; nothing is left.
func (s changeSetup) finish(t *testing.T) {
	ctx := etcdtest.Context(t)
	waits(t, s.w2locked, "Lock behind the downgraded hold")
	require.NoError(t, s.w.RUnlock(ctx))
	waits(t, s.w2locked, "Lock behind the reader")
	require.NoError(t, s.r.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, s.w2locked, served, "Lock once the readers left"))
	require.NoError(t, s.w2.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, s.admin, s.name))
}

func TestDowngradeAnsweredLate(t *testing.T) {
	ctx := etcdtest.Context(t)
	inj := &etcdtest.Injector{}
	s := setUpChange(t, "downgrade-late", inj)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(s.name)), Action: etcdtest.Late, Delay: 300 * time.Millisecond, Times: 1})
	require.NoError(t, s.w.Downgrade(ctx))
	require.NoError(t, etcdtest.Within(t, s.rlocked, served, "RLock behind the downgraded hold"))
	inj.Settle()
	v, _ := value(t, s.admin, s.key)
	assert.True(t, strings.HasSuffix(v, " mode=read"), "value %q", v)
	s.finish(t)
}

// TestDowngradeAppliedWithoutAnAnswer: etcd applies the change and no answer comes before
// ctx ends: the Downgrade says so, and the handle holds a read, as etcd does.
func TestDowngradeAppliedWithoutAnAnswer(t *testing.T) {
	ctx := etcdtest.Context(t)
	inj := &etcdtest.Injector{}
	s := setUpChange(t, "downgrade-dropped", inj)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(s.name)), Action: etcdtest.Drop, Times: 1})
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	assert.ErrorIs(t, s.w.Downgrade(dctx), context.DeadlineExceeded)
	assert.Zero(t, s.w.Token(), "a read hold whatever the outcome")
	assert.ErrorIs(t, s.w.Unlock(ctx), rwmutex.ErrNotLocked, "the write hold ended")
	require.NoError(t, etcdtest.Within(t, s.rlocked, served, "RLock behind the downgraded hold"))
	s.finish(t)
}

// TestDowngradeNeverSent: the change never reaches etcd and ctx ends: the handle holds a
// read all the same, and the key, still a writer's in etcd, keeps the reader waiting until
// it leaves (safe, only slower).
func TestDowngradeNeverSent(t *testing.T) {
	ctx := etcdtest.Context(t)
	inj := &etcdtest.Injector{}
	s := setUpChange(t, "downgrade-lost", inj)
	remove := inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(s.name)), Action: etcdtest.Lose})
	dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, s.w.Downgrade(dctx), context.DeadlineExceeded)
	remove()
	assert.Zero(t, s.w.Token())
	v, _ := value(t, s.admin, s.key)
	assert.False(t, strings.Contains(v, "mode="), "value %q", v)
	waits(t, s.rlocked, "RLock behind a key still a writer's")
	assert.ErrorIs(t, s.w.Unlock(ctx), rwmutex.ErrNotLocked, "the write hold ended")
	require.NoError(t, s.w.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, s.rlocked, served, "RLock once the hold left"))
	waits(t, s.w2locked, "Lock behind the reader")
	require.NoError(t, s.r.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, s.w2locked, served, "Lock once the readers left"))
	require.NoError(t, s.w2.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, s.admin, s.name))
}

// TestUpgradeAnsweredLate: the upgrade's change answered late still upgrades, once the
// reader admitted before it has left; a reader arriving meanwhile waits.
func TestUpgradeAnsweredLate(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "upgrade-late"
	admin := cluster.Client(t)
	r := newRW(t, cluster.Client(t), name)
	require.NoError(t, r.RLock(ctx))
	inj := &etcdtest.Injector{}
	u := newRW(t, inj.Client(t, cluster), name)
	require.NoError(t, u.ULock(ctx))
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Late, Delay: 300 * time.Millisecond, Times: 1})
	upgraded := upgrading(t, ctx, admin, u)
	r2 := newRW(t, cluster.Client(t), name)
	r2locked := etcdtest.Async(func() error { return r2.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 3)
	waits(t, upgraded, "Upgrade with a reader admitted")
	require.NoError(t, r.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, upgraded, served, "Upgrade once the reader left"))
	inj.Settle()
	assert.NotZero(t, u.Token())
	waits(t, r2locked, "RLock behind the upgraded hold")
	require.NoError(t, u.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, r2locked, served, "RLock after the upgraded hold"))
	require.NoError(t, r2.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}
