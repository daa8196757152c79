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
// election, which has Run), with a Doer on a name of the test's own over a client of its own.
func forEachDoer(t *testing.T, what string, test func(t *testing.T, k primtest.Kind, d primtest.Doer, l primtest.Locker, name string, admin *clientv3.Client)) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			name := what + "-" + k.Name
			l := k.First.Make(t, cluster.Client(t), name)
			d, ok := l.(primtest.Doer)
			if !ok {
				t.Skipf("%s has no Do", k.Name)
			}
			test(t, k, d, l, name, cluster.Client(t))
		})
	}
}

// TestDoHoldsWhileFnRunsAndReleasesAfter: fn runs while the hold is held (its key is in
// etcd, another's try is busy), and the key is gone when Do returns nil.
func TestDoHoldsWhileFnRunsAndReleasesAfter(t *testing.T) {
	forEachDoer(t, "do-holds", func(t *testing.T, k primtest.Kind, d primtest.Doer, _ primtest.Locker, name string, admin *clientv3.Client) {
		ctx := etcdtest.Context(t)
		ran := false
		err := d.Do(ctx, func(fctx context.Context) error {
			ran = true
			assert.Equal(t, int64(1), etcdtest.CountKeys(t, admin, k.Keys(name)))
			assert.NoError(t, fctx.Err())
			if k.Busy != nil {
				other := k.Second.Make(t, cluster.Client(t), name)
				assert.ErrorIs(t, other.TryLock(ctx), k.Busy)
			}
			return nil
		})
		require.NoError(t, err)
		assert.True(t, ran)
		assert.Zero(t, etcdtest.CountKeys(t, admin, k.Keys(name)), "the hold was not released after fn")
	})
}

// TestDoLossEndsFnsContextWithErrLost: an operator deletes the hold's key while fn runs:
// fn's ctx ends with a cause matching ErrLost, and Do returns an error matching ErrLost
// (joined with fn's), never nil.
func TestDoLossEndsFnsContextWithErrLost(t *testing.T) {
	forEachDoer(t, "do-lost", func(t *testing.T, k primtest.Kind, d primtest.Doer, _ primtest.Locker, name string, admin *clientv3.Client) {
		ctx := etcdtest.Context(t)
		errStopped := errors.New("stopped on loss")
		err := d.Do(ctx, func(fctx context.Context) error {
			_, err := admin.Delete(ctx, k.Keys(name), clientv3.WithPrefix())
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
	forEachDoer(t, "do-panic", func(t *testing.T, k primtest.Kind, d primtest.Doer, _ primtest.Locker, name string, admin *clientv3.Client) {
		ctx := etcdtest.Context(t)
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = d.Do(ctx, func(context.Context) error { panic("boom") })
			return nil
		}()
		assert.Equal(t, "boom", recovered)
		assert.Zero(t, etcdtest.CountKeys(t, admin, k.Keys(name)), "the hold was not released before the panic went on")
	})
}

// TestDoWithCtxDoneOrNilFnWritesNothing: with ctx done already Do returns ctx's error, and
// with a nil fn ErrInvalidOption; neither calls fn nor writes to etcd.
func TestDoWithCtxDoneOrNilFnWritesNothing(t *testing.T) {
	forEachDoer(t, "do-nothing", func(t *testing.T, _ primtest.Kind, d primtest.Doer, _ primtest.Locker, _ string, admin *clientv3.Client) {
		before := etcdtest.Revision(t, admin)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		called := false
		fn := func(context.Context) error { called = true; return nil }
		assert.ErrorIs(t, d.Do(done, fn), context.Canceled)
		assert.ErrorIs(t, d.Do(etcdtest.Context(t), nil), core.ErrInvalidOption)
		assert.False(t, called)
		etcdtest.NoWrites(t, admin, before, "a Do that could not start wrote to etcd")
	})
}

// TestDoReleasesWhenCtxEndsDuringFn: ctx ends while fn runs: fn's ctx ends with ctx's cause,
// and the hold is still released (on a context of its own) once fn returns.
func TestDoReleasesWhenCtxEndsDuringFn(t *testing.T) {
	forEachDoer(t, "do-cancel", func(t *testing.T, k primtest.Kind, d primtest.Doer, _ primtest.Locker, name string, admin *clientv3.Client) {
		ctx, cancel := context.WithCancelCause(etcdtest.Context(t))
		errShutdown := errors.New("shutting down")
		err := d.Do(ctx, func(fctx context.Context) error {
			cancel(errShutdown)
			<-fctx.Done()
			assert.ErrorIs(t, context.Cause(fctx), errShutdown)
			return context.Cause(fctx)
		})
		assert.ErrorIs(t, err, errShutdown)
		assert.NotErrorIs(t, err, core.ErrLost)
		assert.Zero(t, etcdtest.CountKeys(t, admin, k.Keys(name)), "the hold was not released after ctx ended")
	})
}
