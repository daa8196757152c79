package primtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// forEachDoer runs test over every kind whose First runs work scoped to a hold (all but the
// election, which has Run), with a Doer on a name of the test's own over a client of its own
// of c, starting with member 1, and an admin client of c starting with member 0.
func forEachDoer(t *testing.T, c *etcdtest.Cluster, what string, test func(t *testing.T, dc doCase)) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			dc := doCase{k: k, name: what + "-" + k.Name, c: c, admin: etcdtest.SpreadClient(t, c, 0)}
			dc.l = k.First.Make(t, etcdtest.SpreadClient(t, c, 1), dc.name)
			d, ok := dc.l.(primtest.Doer)
			if !ok {
				t.Skipf("%s has no Do", k.Name)
			}
			dc.d = d
			test(t, dc)
		})
	}
}

// A doCase is one kind's Do on a name of the test's own.
type doCase struct {
	k     primtest.Kind
	name  string
	c     *etcdtest.Cluster
	l     primtest.Locker // First's handle, whose Do it is
	d     primtest.Doer
	admin *clientv3.Client
}

// second opens a Second handle on the name, on a client of c starting with member 2.
func (dc doCase) second(t *testing.T) primtest.Locker {
	return dc.k.Second.Make(t, etcdtest.SpreadClient(t, dc.c, 2), dc.name)
}

// keys counts the name's keys of holds and waiters.
func (dc doCase) keys(t *testing.T) int64 { return etcdtest.CountKeys(t, dc.admin, dc.k.Keys(dc.name)) }

// waitingCluster is where the Do tests run in which a client waits for what a client of
// another member did: the binary's 3-member LaggingCluster, or the shared cluster when it
// has three members already (ETCD_ENDPOINTS) or under -short.
func waitingCluster(t *testing.T) *etcdtest.Cluster {
	if testing.Short() || cluster.Size() >= 3 {
		return cluster
	}
	return etcdtest.LaggingCluster(t)
}

// TestDoHoldsWhileFnRunsAndReleasesAfter: while fn runs the hold's key is in etcd, another's
// try is busy and another's Lock, on a client of another member, waits; once Do has returned
// nil the key is gone and that waiter is served.
func TestDoHoldsWhileFnRunsAndReleasesAfter(t *testing.T) {
	forEachDoer(t, waitingCluster(t), "do-holds", func(t *testing.T, dc doCase) {
		ctx := etcdtest.Context(t)
		waiter := dc.second(t)
		var key string
		var served <-chan error
		err := dc.d.Do(ctx, func(fctx context.Context) error {
			key = dc.l.Key()
			assert.Equal(t, int64(1), dc.keys(t))
			assert.NoError(t, fctx.Err())
			if dc.k.Busy != nil {
				assert.ErrorIs(t, dc.second(t).TryLock(ctx), dc.k.Busy)
			}
			served = etcdtest.Async(func() error { return waiter.Lock(ctx) })
			if dc.k.InLine {
				etcdtest.AwaitKeys(t, dc.admin, dc.k.Keys(dc.name), 2)
			}
			etcdtest.Pending(t, served, "another's Lock while fn runs")
			return nil
		})
		require.NoError(t, err)
		require.NotEmpty(t, key, "the hold's key while fn ran")
		assert.Zero(t, etcdtest.CountKeys(t, dc.admin, key), "the hold was not released after fn")
		require.NoError(t, etcdtest.Within(t, served, 20*time.Second, "the waiter, once Do released"))
		require.NoError(t, waiter.Unlock(ctx))
		assert.Zero(t, dc.keys(t))
	})
}

// TestDoLossEndsFnsContextWithErrLost: an operator, on a client of another member, deletes
// the hold's key while fn runs: fn's ctx ends with a cause matching ErrLost, and Do returns
// an error matching ErrLost (joined with fn's), never nil.
func TestDoLossEndsFnsContextWithErrLost(t *testing.T) {
	forEachDoer(t, waitingCluster(t), "do-lost", func(t *testing.T, dc doCase) {
		ctx := etcdtest.Context(t)
		errStopped := errors.New("stopped on loss")
		err := dc.d.Do(ctx, func(fctx context.Context) error {
			_, err := dc.admin.Delete(ctx, dc.k.Keys(dc.name), clientv3.WithPrefix())
			require.NoError(t, err)
			select {
			case <-fctx.Done():
			case <-time.After(20 * time.Second):
				t.Error("fn's ctx did not end within 20s of the loss")
			}
			assert.ErrorIs(t, context.Cause(fctx), core.ErrLost)
			return errStopped
		})
		assert.ErrorIs(t, err, core.ErrLost)
		assert.ErrorIs(t, err, errStopped)
	})
}

// TestDoReleasesWhenFnPanics: the hold is released before the panic goes on to the caller.
func TestDoReleasesWhenFnPanics(t *testing.T) {
	forEachDoer(t, cluster, "do-panic", func(t *testing.T, dc doCase) {
		ctx := etcdtest.Context(t)
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = dc.d.Do(ctx, func(context.Context) error { panic("boom") })
			return nil
		}()
		assert.Equal(t, "boom", recovered)
		assert.Zero(t, dc.keys(t), "the hold was not released before the panic went on")
	})
}

// TestDoWithCtxDoneOrNilFnWritesNothing: with ctx done already Do returns ctx's error, and
// with a nil fn ErrInvalidOption; neither calls fn nor writes to etcd.
func TestDoWithCtxDoneOrNilFnWritesNothing(t *testing.T) {
	forEachDoer(t, cluster, "do-nothing", func(t *testing.T, dc doCase) {
		before := etcdtest.Revision(t, dc.admin)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		called := false
		fn := func(context.Context) error { called = true; return nil }
		assert.ErrorIs(t, dc.d.Do(done, fn), context.Canceled)
		assert.ErrorIs(t, dc.d.Do(etcdtest.Context(t), nil), core.ErrInvalidOption)
		assert.False(t, called)
		etcdtest.NoWrites(t, dc.admin, before, "a Do that could not start wrote to etcd")
	})
}

// TestDoReleasesWhenCtxEndsDuringFn: ctx ends while fn runs: fn's ctx ends with ctx's cause,
// and the hold is still released (on a context of its own) once fn returns.
func TestDoReleasesWhenCtxEndsDuringFn(t *testing.T) {
	forEachDoer(t, cluster, "do-cancel", func(t *testing.T, dc doCase) {
		ctx, cancel := context.WithCancelCause(etcdtest.Context(t))
		errShutdown := errors.New("shutting down")
		err := dc.d.Do(ctx, func(fctx context.Context) error {
			cancel(errShutdown)
			<-fctx.Done()
			assert.ErrorIs(t, context.Cause(fctx), errShutdown)
			return context.Cause(fctx)
		})
		assert.ErrorIs(t, err, errShutdown)
		assert.NotErrorIs(t, err, core.ErrLost)
		assert.Zero(t, dc.keys(t), "the hold was not released after ctx ended")
	})
}

// TestDoReleasesOnlyItsOwnHold: fn unlocks its hold, and another goroutine then locks the
// same handle before fn returns: Do's release leaves that later hold alone (it stays live,
// its key in etcd) and Do says ErrNotLocked, not ErrLost.
func TestDoReleasesOnlyItsOwnHold(t *testing.T) {
	forEachDoer(t, cluster, "do-own", func(t *testing.T, dc doCase) {
		ctx := etcdtest.Context(t)
		err := dc.d.Do(ctx, func(fctx context.Context) error {
			assert.NoError(t, dc.l.Unlock(fctx))
			locked := etcdtest.Async(func() error { return dc.l.Lock(ctx) })
			assert.NoError(t, etcdtest.Within(t, locked, 20*time.Second, "the later Lock"))
			return nil
		})
		assert.ErrorIs(t, err, core.ErrNotLocked)
		assert.NotErrorIs(t, err, core.ErrLost)
		assert.NoError(t, dc.l.Err(), "Do's release ended the later hold")
		assert.Equal(t, int64(1), dc.keys(t), "Do's release deleted the later hold's key")
		require.NoError(t, dc.l.Unlock(ctx))
		assert.Zero(t, dc.keys(t))
	})
}

// TestDoEndsFnsContextWhenFnReleases: fn unlocks its hold: fn's ctx ends, as the work is no
// longer scoped to a hold, and not with a loss (reentrant's owning context ends with
// context.Canceled on its last Unlock, the others' with ErrNotLocked).
func TestDoEndsFnsContextWhenFnReleases(t *testing.T) {
	forEachDoer(t, cluster, "do-early", func(t *testing.T, dc doCase) {
		ctx := etcdtest.Context(t)
		err := dc.d.Do(ctx, func(fctx context.Context) error {
			assert.NoError(t, dc.l.Unlock(fctx))
			etcdtest.Within(t, fctx.Done(), 20*time.Second, "the end of fn's ctx after its release")
			assert.NotErrorIs(t, context.Cause(fctx), core.ErrLost)
			return nil
		})
		assert.ErrorIs(t, err, core.ErrNotLocked)
		assert.Zero(t, dc.keys(t))
	})
}
