package misusetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
	"github.com/etcdsync/etcdsync/trylock"
)

// timeoutOverrun is how long past d trylock.Timeout(ctx, l, d) may return, as its doc
// says: a try under way at d waits up to 1 s more for etcd's answer, then up to 1 s for the
// removal of a key it may have written.
const timeoutOverrun = 2 * time.Second

// schedulingSlack allows for a loaded machine (and the race detector) on top of that.
const schedulingSlack = 500 * time.Millisecond

// A tryKind is a Locker of every etcdsync primitive, with how to let go of what it took.
type tryKind struct {
	name string
	open func(t *testing.T, cli *clientv3.Client, name string) (l trylock.Locker, unlock func(context.Context) error)
}

var tryKinds = []tryKind{
	{"mutex", func(t *testing.T, cli *clientv3.Client, name string) (trylock.Locker, func(context.Context) error) {
		m, err := mutex.New(cli, name)
		require.NoError(t, err)
		return m, m.Unlock
	}},
	{"rwmutex", func(t *testing.T, cli *clientv3.Client, name string) (trylock.Locker, func(context.Context) error) {
		rw, err := rwmutex.New(cli, name)
		require.NoError(t, err)
		return rw, rw.Unlock
	}},
	{"RLocker", func(t *testing.T, cli *clientv3.Client, name string) (trylock.Locker, func(context.Context) error) {
		rw, err := rwmutex.New(cli, name)
		require.NoError(t, err)
		return trylock.RLocker(rw), rw.RUnlock
	}},
	{"Reentrant", func(t *testing.T, cli *clientv3.Client, name string) (trylock.Locker, func(context.Context) error) {
		m, err := reentrant.New(cli, name)
		require.NoError(t, err)
		l := trylock.Reentrant(m)
		return l, func(context.Context) error { return m.Unlock(l.Context()) }
	}},
	{"Permits", func(t *testing.T, cli *clientv3.Client, name string) (trylock.Locker, func(context.Context) error) {
		s, err := semaphore.New(cli, name, 2)
		require.NoError(t, err)
		l := trylock.Permits(s)
		return l, func(ctx context.Context) error { return l.Permit().Release(ctx) }
	}},
}

// TestTimeoutIsBoundedWhenEtcdIsUnreachable: trylock.Timeout(ctx, l, d) over a client whose
// traffic is black-holed (a try in flight, the release watch armed and never created)
// returns ErrTimeout within d + 2 s, for every Locker.
func TestTimeoutIsBoundedWhenEtcdIsUnreachable(t *testing.T) {
	const d = 300 * time.Millisecond
	for _, k := range tryKinds {
		t.Run(k.name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			cli, proxy := etcdtest.ProxiedClient(t, cluster, 0)
			l, unlock := k.open(t, cli, "misuse-timeout-"+k.name)
			// A first lock grants the client's lease: the try at d is then a Txn in flight.
			require.NoError(t, trylock.Once(ctx, l))
			require.NoError(t, unlock(ctx))

			proxy.Blackhole()
			defer proxy.Restore()
			start := time.Now()
			err := etcdtest.Within(t, etcdtest.Async(func() error { return trylock.Timeout(ctx, l, d) }),
				d+timeoutOverrun+5*time.Second, "Timeout")
			took := time.Since(start)
			t.Logf("Timeout(%v) took %v: %v", d, took.Round(time.Millisecond), err)
			assert.ErrorIs(t, err, trylock.ErrTimeout)
			assert.Less(t, took, d+timeoutOverrun+schedulingSlack)
		})
	}
}
