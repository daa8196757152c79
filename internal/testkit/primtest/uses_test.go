package primtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// A use is a kind of primitive on a name: what it leaves there (a hold on a lease, or
// records that outlive every lease), and an acquisition of it.
type use struct {
	name string
	// leave leaves the use's traces on name and returns what ends them (nothing for
	// records, which last).
	leave func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) func()
	take  func(ctx context.Context, cli *clientv3.Client, name string) error
}

func uses() []use {
	held := func(lock func(context.Context, *clientv3.Client, string) (func(context.Context) error, error)) func(context.Context, *testing.T, *clientv3.Client, string) func() {
		return func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) func() {
			unlock, err := lock(ctx, cli, name)
			require.NoError(t, err)
			return func() { assert.NoError(t, unlock(context.Background())) }
		}
	}
	lock := func(ctx context.Context, cli *clientv3.Client, name string) (func(context.Context) error, error) {
		m, err := mutex.New(cli, name)
		if err != nil {
			return nil, err
		}
		return m.Unlock, m.Lock(ctx)
	}
	reentrantLock := func(ctx context.Context, cli *clientv3.Client, name string) error {
		m, err := reentrant.New(cli, name)
		if err != nil {
			return err
		}
		_, err = m.Lock(ctx)
		return err
	}
	campaign := func(ctx context.Context, cli *clientv3.Client, name string) (func(context.Context) error, error) {
		e, err := election.New(cli, name, election.WithPreference(1)) // "p1/": an election's own
		if err != nil {
			return nil, err
		}
		return e.Resign, e.Campaign(ctx, "v")
	}
	rlock := func(ctx context.Context, cli *clientv3.Client, name string) (func(context.Context) error, error) {
		rw, err := rwmutex.New(cli, name)
		if err != nil {
			return nil, err
		}
		return rw.RUnlock, rw.RLock(ctx)
	}
	acquire := func(ctx context.Context, cli *clientv3.Client, name string) (func(context.Context) error, error) {
		s, err := semaphore.New(cli, name, 2)
		if err != nil {
			return nil, err
		}
		p, err := s.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return p.Release, nil
	}
	enterLeave := func(ctx context.Context, cli *clientv3.Client, name string) error {
		b, err := barrier.New(cli, name, 1)
		if err != nil {
			return err
		}
		if err := b.Enter(ctx); err != nil {
			return err
		}
		return b.Leave(ctx)
	}
	gateHold := func(ctx context.Context, cli *clientv3.Client, name string) (func(context.Context) error, error) {
		g, err := barrier.NewGate(cli, name)
		if err != nil {
			return nil, err
		}
		return g.Release, g.Hold(ctx)
	}
	set := func(ctx context.Context, cli *clientv3.Client, name string) error {
		l, err := latch.New(cli, name)
		if err != nil {
			return err
		}
		return l.Set(ctx, 1)
	}
	lasting := func(do func(context.Context, *clientv3.Client, string) error) func(context.Context, *testing.T, *clientv3.Client, string) func() {
		return func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) func() {
			require.NoError(t, do(ctx, cli, name))
			return func() {}
		}
	}
	return []use{
		{"lock", held(lock), func(ctx context.Context, cli *clientv3.Client, name string) error {
			unlock, err := lock(ctx, cli, name)
			if err == nil {
				_ = unlock(ctx)
			}
			return err
		}},
		{"reentrant", held(func(ctx context.Context, cli *clientv3.Client, name string) (func(context.Context) error, error) {
			return lock(ctx, cli, name) // the same keys as a mutex's
		}), reentrantLock},
		{"election", held(campaign), func(ctx context.Context, cli *clientv3.Client, name string) error {
			resign, err := campaign(ctx, cli, name)
			if err == nil {
				_ = resign(ctx)
			}
			return err
		}},
		{"rwlock", held(rlock), func(ctx context.Context, cli *clientv3.Client, name string) error {
			rw, err := rwmutex.New(cli, name)
			if err != nil {
				return err
			}
			return rw.Lock(ctx)
		}},
		{"semaphore", lasting(func(ctx context.Context, cli *clientv3.Client, name string) error {
			release, err := acquire(ctx, cli, name)
			if err != nil {
				return err
			}
			return release(ctx) // its limit record stays
		}), func(ctx context.Context, cli *clientv3.Client, name string) error {
			_, err := acquire(ctx, cli, name)
			return err
		}},
		{"barrier", lasting(enterLeave), enterLeave},
		{"gate", held(gateHold), func(ctx context.Context, cli *clientv3.Client, name string) error {
			_, err := gateHold(ctx, cli, name)
			return err
		}},
		{"latch", lasting(set), set},
	}
}

// sameKeys are the pairs of uses whose keys are laid out alike, as etcd's Mutex and
// Election are: a lock and a candidate without a preference exclude each other rather than
// fail (the test's candidates have one, which a lock tells).
var sameKeys = map[[2]string]bool{{"lock", "reentrant"}: true, {"reentrant", "lock"}: true,
	{"lock", "election"}: true, {"reentrant", "election"}: true}

// TestNoPrimitiveWaitsOnAnotherKindsKeys: on a name that holds another kind's keys or
// records (a hold of it, or what a semaphore, a barrier or a latch used once left behind),
// every primitive fails at once with ErrOtherKind, naming what it found, and writes
// nothing; once the records are gone, the name is free for any kind. Every pair of kinds,
// both ways. (A semaphore used once made every later lock of its name wait for good.)
func TestNoPrimitiveWaitsOnAnotherKindsKeys(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	for _, first := range uses() {
		for _, then := range uses() {
			if first.name == then.name || sameKeys[[2]string{first.name, then.name}] {
				continue
			}
			t.Run(first.name+" then "+then.name, func(t *testing.T) {
				name := fmt.Sprintf("uses-%s-%s", first.name, then.name)
				end := first.leave(ctx, t, cluster.Client(t), name)
				before := etcdtest.Revision(t, admin)
				tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				err := then.take(tctx, cluster.Client(t), name)
				assert.ErrorIs(t, err, etcdsync.ErrOtherKind)
				assert.ErrorContains(t, err, core.NamePrefix(name))
				etcdtest.NoWrites(t, admin, before, then.name+" on a name of a "+first.name)
				end()
				_, err = admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
				require.NoError(t, err)
				require.NoError(t, then.take(tctx, cluster.Client(t), name), "once the name is clear")
				_, err = admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
				require.NoError(t, err)
			})
		}
	}
}

// TestATryOnAnotherKindsNameSaysSo: a try of a lock, a writer or a Multi on a name whose
// first key is another kind's (a semaphore's record) fails with ErrOtherKind, not
// ErrLocked, in its one Txn, having written nothing.
func TestATryOnAnotherKindsNameSaysSo(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	const name = "uses-try"
	s, err := semaphore.New(admin, name, 1)
	require.NoError(t, err)
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, p.Release(ctx))
	cli := cluster.Client(t)
	m, err := mutex.New(cli, name)
	require.NoError(t, err)
	rw, err := rwmutex.New(cli, name)
	require.NoError(t, err)
	multi, err := mutex.NewMulti(cli, []string{name, name + "-other"})
	require.NoError(t, err)
	before := etcdtest.Revision(t, admin)
	for what, try := range map[string]func(context.Context) error{"mutex": m.TryLock, "rwmutex": rw.TryLock, "multi": multi.TryLock} {
		assert.ErrorIs(t, try(ctx), etcdsync.ErrOtherKind, what)
	}
	etcdtest.NoWrites(t, admin, before, "a try on another kind's name")
	_, err = admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
}
