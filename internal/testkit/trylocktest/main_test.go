package trylock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/trylock"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

var newMutex = primtest.MustNew(mutex.New)

// unchanged fails the test if anything was written to etcd since before, or if name has
// other than keys keys: the failed tries in between left nothing behind.
func unchanged(t *testing.T, cli *clientv3.Client, name string, keys, before int64) {
	t.Helper()
	etcdtest.NoWrites(t, cli, before, "a failed try wrote to etcd")
	require.Equal(t, keys, primtest.Keys(t, cli, name), "keys of %q", name)
}

// tracked is a real Locker whose tries are counted and reported; it keeps the Locker's
// WatchRelease, so retries through it wake on releases.
type tracked struct {
	trylock.ReleaseWatcher
	tries atomic.Int32
	tried chan error // every try's result; never blocks the try
}

func track(l trylock.ReleaseWatcher) *tracked {
	return &tracked{ReleaseWatcher: l, tried: make(chan error, 1000)}
}

func (c *tracked) TryLock(ctx context.Context) error {
	err := c.ReleaseWatcher.TryLock(ctx)
	c.tries.Add(1)
	c.tried <- err
	return err
}

// blind hides the WatchRelease of the Locker it wraps: its retries only back off.
type blind struct{ l trylock.Locker }

func (b blind) TryLock(ctx context.Context) error { return b.l.TryLock(ctx) }

// warmHold takes a lock with first, queues second (on the client that will retry) behind
// it with wait, and lets first go with release, so that second holds the lock when it
// returns. second's client then has a watch of the name that has started and dispatched a
// delete: a retry on that client starts from a known revision, and its first wait cannot
// end early because the watch is new (see core.ReleaseWatch). keys is how many keys the
// name has while second waits.
func warmHold(t *testing.T, admin *clientv3.Client, name string, keys int64, first, wait, release func(context.Context) error) {
	t.Helper()
	ctx := etcdtest.Context(t)
	require.NoError(t, first(ctx))
	waited := make(chan error, 1)
	go func() { waited <- wait(ctx) }()
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), keys)
	require.NoError(t, release(ctx))
	require.NoError(t, etcdtest.Within(t, waited, 10*time.Second, "the queued waiter's lock"))
}
