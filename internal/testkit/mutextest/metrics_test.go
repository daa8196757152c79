package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	mt "github.com/etcdsync/etcdsync/internal/testkit/metrictest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
)

var (
	primMutex = mt.Primitive.String("mutex")
	acquired  = mt.Outcome.String("acquired")
	busy      = mt.Outcome.String("busy")
	canceled  = mt.Outcome.String("canceled")
	failed    = mt.Outcome.String("error")
	released  = mt.Outcome.String("released")
	lost      = mt.Outcome.String("lost")
)

// TestMetricsCountAKnownWorkload: an acquisition, a try that finds the lock held, a wait
// cancelled while queued and a release are each measured once, with their outcome; the
// waiter is counted while it waits, the hold while it lasts, and both are back at zero.
func TestMetricsCountAKnownWorkload(t *testing.T) {
	ctx := etcdtest.Context(t)
	r := mt.NewReader(t)
	const name = "metrics-workload"
	cli := cluster.Client(t)
	holder := newMutex(t, cli, name, mutex.WithMeterProvider(r.Provider))
	other := newMutex(t, cluster.Client(t), name, mutex.WithMeterProvider(r.Provider))

	require.NoError(t, holder.Lock(ctx))
	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Sum(mt.Holds, primMutex), "one hold while locked")
	assert.Equal(t, "s", d.Unit(mt.AcquireDuration))

	require.ErrorIs(t, other.TryLock(ctx), mutex.ErrLocked)

	wctx, cancel := context.WithCancel(ctx)
	waited := etcdtest.Async(func() error { return other.Lock(wctx) })
	primtest.AwaitKeys(t, cli, name, 2)
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Waiters, primMutex), "one waiter while it waits")
	cancel()
	require.ErrorIs(t, etcdtest.Within(t, waited, 10*time.Second, "the cancelled Lock"), context.Canceled)

	require.NoError(t, holder.Unlock(ctx))

	d = r.Collect(t)
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, primMutex, acquired))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, primMutex, busy))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, primMutex, canceled))
	assert.EqualValues(t, 0, d.Count(mt.AcquireDuration, primMutex, failed))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, primMutex, released))
	assert.EqualValues(t, 0, d.Count(mt.HoldDuration, primMutex, lost))
	assert.EqualValues(t, 0, d.Sum(mt.HoldLost))
	assert.EqualValues(t, 0, d.Sum(mt.Holds, primMutex), "holds back to zero")
	assert.EqualValues(t, 0, d.Sum(mt.Waiters, primMutex), "waiters back to zero")
	n, ahead := d.Histogram(mt.QueueAhead, primMutex)
	assert.EqualValues(t, 2, n, "both Locks joined the line (a try does not)")
	assert.EqualValues(t, 1, ahead, "the holder found nobody ahead, the waiter one key")
	for _, set := range d.Attributes(mt.AcquireDuration) {
		assert.False(t, set.HasValue(mt.Name), "the name without WithNameAttribute: %v", set)
	}
}

// TestMetricsCountLossesByCause: a hold lost to a revoked lease, a deleted key or Shutdown
// is counted once under its cause, whether the loss is seen by the hold's watch (Done) or
// only by Unlock, whose span says lost.
func TestMetricsCountLossesByCause(t *testing.T) {
	causes := []struct {
		cause string
		lose  func(t *testing.T, ctx context.Context, cli, admin *clientv3.Client, m *mutex.Mutex)
	}{
		{"revoked", func(t *testing.T, ctx context.Context, _, admin *clientv3.Client, m *mutex.Mutex) {
			resp, err := admin.Get(ctx, m.Key())
			require.NoError(t, err)
			require.Len(t, resp.Kvs, 1)
			_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
			require.NoError(t, err)
		}},
		{"deleted", func(t *testing.T, ctx context.Context, _, admin *clientv3.Client, m *mutex.Mutex) {
			_, err := admin.Delete(ctx, m.Key())
			require.NoError(t, err)
		}},
		{"shutdown", func(t *testing.T, ctx context.Context, cli, _ *clientv3.Client, _ *mutex.Mutex) {
			require.NoError(t, mutex.Shutdown(ctx, cli))
		}},
	}
	for _, c := range causes {
		for _, watched := range []bool{true, false} {
			seen := "seen by Unlock"
			if watched {
				seen = "seen by Done"
			}
			t.Run(c.cause+"/"+seen, func(t *testing.T) {
				sr := mt.Spans(t)
				ctx, parent := mt.Parent(etcdtest.Context(t), "request")
				defer parent.End()
				r := mt.NewReader(t)
				cli := cluster.Client(t)
				m := newMutex(t, cli, "metrics-loss-"+c.cause, mutex.WithMeterProvider(r.Provider))
				require.NoError(t, m.Lock(ctx))
				if watched {
					m.Done() // starts the watch
				}
				c.lose(t, ctx, cli, cluster.Client(t), m)
				if watched {
					etcdtest.Within(t, m.Done(), 10*time.Second, "Done after the loss")
				}
				require.ErrorIs(t, m.Unlock(ctx), mutex.ErrLost)
				assert.Equal(t, []string{"lost"}, mt.Outcomes(sr, "etcdsync.mutex.Unlock"))

				d := r.Collect(t)
				assert.EqualValues(t, 1, d.Sum(mt.HoldLost, primMutex, mt.Cause.String(c.cause)))
				assert.EqualValues(t, 1, d.Sum(mt.HoldLost), "one loss in all")
				assert.EqualValues(t, 1, d.Count(mt.HoldDuration, primMutex, lost))
				assert.EqualValues(t, 0, d.Count(mt.HoldDuration, primMutex, released))
				assert.EqualValues(t, 0, d.Sum(mt.Holds, primMutex), "holds back to zero")
			})
		}
	}
}

// TestMetricsCountALossAtTheLocalDeadline: a holder whose client is black-holed loses its
// hold at the lease's local deadline, counted under cause deadline, and its keep-alive's
// failed renewals are counted as well as the ones that got through before.
func TestMetricsCountALossAtTheLocalDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lease's local deadline")
	}
	ctx := etcdtest.Context(t)
	r := mt.NewReader(t)
	cli, proxy := etcdtest.ProxiedClient(t, cluster, 0)
	m := newMutex(t, cli, "metrics-deadline", mutex.WithTTL(2*time.Second), mutex.WithMeterProvider(r.Provider))
	require.NoError(t, m.Lock(ctx))
	renewed := mt.Outcome.String("ok")
	require.Eventually(t, func() bool { return r.Collect(t).Sum(mt.LeaseRenewals, renewed) > 0 },
		10*time.Second, 20*time.Millisecond, "a renewal of the 2 s lease within 10 s")

	proxy.Blackhole()
	etcdtest.Within(t, m.Done(), 15*time.Second, "Done at the local deadline")
	proxy.Restore()
	require.ErrorIs(t, m.Unlock(ctx), mutex.ErrLost)

	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Sum(mt.HoldLost, primMutex, mt.Cause.String("deadline")))
	assert.EqualValues(t, 1, d.Sum(mt.HoldLost), "one loss in all")
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, primMutex, lost))
	assert.EqualValues(t, 0, d.Sum(mt.Holds, primMutex), "holds back to zero")
	assert.Positive(t, d.Sum(mt.LeaseRenewals, mt.Outcome.String("failed")), "renewals failed while black-holed")
	for _, set := range d.Attributes(mt.LeaseRenewals) {
		assert.Equal(t, 1, set.Len(), "a renewal has the outcome alone: %v", set)
	}
}

// TestMetricsCarryTheNameOnlyWithNameAttribute: with WithNameAttribute every measurement of
// the handle carries its name.
func TestMetricsCarryTheNameOnlyWithNameAttribute(t *testing.T) {
	ctx := etcdtest.Context(t)
	r := mt.NewReader(t)
	const name = "metrics-named"
	named := newMutex(t, cluster.Client(t), name, mutex.WithMeterProvider(r.Provider), mutex.WithNameAttribute())
	plain := newMutex(t, cluster.Client(t), name, mutex.WithMeterProvider(r.Provider))
	require.NoError(t, named.Lock(ctx))
	require.ErrorIs(t, plain.TryLock(ctx), mutex.ErrLocked)
	require.NoError(t, named.Unlock(ctx))

	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, acquired, mt.Name.String(name)))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, released, mt.Name.String(name)))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, busy))
	assert.EqualValues(t, 0, d.Count(mt.AcquireDuration, busy, mt.Name.String(name)), "the plain handle's try has no name")
}

// TestMetricsGiveTheAgeOfTheOldestHold: etcdsync.hold.oldest is, per name with
// WithNameAttribute and per primitive without, the age of the oldest hold granted and not
// ended; a name with no hold left has no point.
func TestMetricsGiveTheAgeOfTheOldestHold(t *testing.T) {
	ctx := etcdtest.Context(t)
	r := mt.NewReader(t)
	cli := cluster.Client(t)
	type held struct {
		m             *mutex.Mutex
		before, after time.Time // the Lock's call and return: the grant is between
	}
	lock := func(name string, opts ...mutex.Option) held {
		m := newMutex(t, cli, name, append(opts, mutex.WithMeterProvider(r.Provider))...)
		h := held{m: m, before: time.Now()}
		require.NoError(t, m.Lock(ctx))
		h.after = time.Now()
		return h
	}
	a := lock("oldest-a", mutex.WithNameAttribute())
	b := lock("oldest-b", mutex.WithNameAttribute())
	p1 := lock("oldest-p1")
	p2 := lock("oldest-p2")
	collect := func() (ages map[string]float64, from, to time.Time) {
		from = time.Now()
		ages = r.Collect(t).Gauge(mt.HoldOldest, mt.Name)
		return ages, from, time.Now()
	}
	between := func(age float64, h held, from, to time.Time, what string) {
		t.Helper()
		assert.GreaterOrEqual(t, age, from.Sub(h.after).Seconds(), what)
		assert.LessOrEqual(t, age, to.Sub(h.before).Seconds(), what)
	}

	ages, from, to := collect()
	require.Len(t, ages, 3, "a point per name held with the attribute, one for the plain handles: %v", ages)
	between(ages["oldest-a"], a, from, to, "the age of oldest-a's hold")
	between(ages["oldest-b"], b, from, to, "the age of oldest-b's hold")
	between(ages[""], p1, from, to, "without the name: the older of the two plain holds")
	assert.GreaterOrEqual(t, ages["oldest-a"], ages["oldest-b"], "a was granted first")

	require.NoError(t, a.m.Unlock(ctx))
	require.NoError(t, p1.m.Unlock(ctx))
	ages, from, to = collect()
	assert.NotContains(t, ages, "oldest-a", "a name with no hold left has no point")
	between(ages["oldest-b"], b, from, to, "oldest-b still held")
	between(ages[""], p2, from, to, "the plain holds: p2's now")

	require.NoError(t, b.m.Unlock(ctx))
	require.NoError(t, p2.m.Unlock(ctx))
	ages, _, _ = collect()
	assert.Empty(t, ages, "no hold, no point")
}

// TestSpansShowAcquisitionsAndReleases: with a TracerProvider set, every Lock, TryLock and
// Unlock is a span, a child of the caller's, with the outcome.
func TestSpansShowAcquisitionsAndReleases(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(etcdtest.Context(t), "request")
	const name = "metrics-spans"
	holder := newMutex(t, cluster.Client(t), name)
	other := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	require.ErrorIs(t, other.TryLock(ctx), mutex.ErrLocked)
	require.NoError(t, holder.Unlock(ctx))
	require.ErrorIs(t, holder.Unlock(ctx), mutex.ErrNotLocked)
	parent.End()

	assert.Equal(t, []string{"acquired"}, mt.Outcomes(sr, "etcdsync.mutex.Lock"))
	assert.Equal(t, []string{"busy"}, mt.Outcomes(sr, "etcdsync.mutex.TryLock"))
	assert.Equal(t, []string{"released", "error"}, mt.Outcomes(sr, "etcdsync.mutex.Unlock"))
	for _, s := range sr.Ended() {
		if s.Name() == "request" {
			continue
		}
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of the request", s.Name())
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
	}
}
