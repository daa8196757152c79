package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	mt "github.com/etcdsync/etcdsync/internal/testkit/metrictest"
	"github.com/etcdsync/etcdsync/semaphore"
)

// TestMetricsCountAKnownWorkload: two permits of two, a try that finds none free, a wait
// cancelled while queued; each permit is a hold; spans tell the same.
func TestMetricsCountAKnownWorkload(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(testContext(t), "request")
	r := mt.NewReader(t)
	const name = "metrics-workload"
	prim := mt.Primitive.String("semaphore")
	cli := cluster.Client(t)
	s := newSemaphore(t, cli, name, 2, semaphore.WithMeterProvider(r.Provider))

	p1, err := s.Acquire(ctx)
	require.NoError(t, err)
	p2, err := s.Acquire(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, r.Collect(t).Sum(mt.Holds, prim), "two permits held")
	_, err = s.TryAcquire(ctx)
	require.ErrorIs(t, err, semaphore.ErrNoPermits)
	wctx, cancel := context.WithCancel(ctx)
	waited := acquireAsync(wctx, s)
	awaitPermits(t, cli, name, 3)
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Waiters, prim), "one waiter")
	cancel()
	require.ErrorIs(t, etcdtest.Within(t, waited, 10*time.Second, "the cancelled Acquire").err, context.Canceled)
	require.NoError(t, p1.Release(ctx))
	require.NoError(t, p2.Release(ctx))
	parent.End()

	d := r.Collect(t)
	assert.EqualValues(t, 2, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("acquired")))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("busy")))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("canceled")))
	assert.EqualValues(t, 4, d.Count(mt.AcquireDuration), "nothing else")
	assert.EqualValues(t, 2, d.Count(mt.HoldDuration, prim, mt.Outcome.String("released")))
	assert.EqualValues(t, 2, d.Count(mt.HoldDuration), "nothing else")
	assert.EqualValues(t, 0, d.Sum(mt.Holds), "holds back to zero")
	assert.EqualValues(t, 0, d.Sum(mt.Waiters), "waiters back to zero")

	assert.Equal(t, []string{"acquired", "acquired", "canceled"}, mt.Outcomes(sr, "etcdsync.semaphore.Acquire"))
	assert.Equal(t, []string{"busy"}, mt.Outcomes(sr, "etcdsync.semaphore.TryAcquire"))
	assert.Equal(t, []string{"released", "released"}, mt.Outcomes(sr, "etcdsync.semaphore.Release"))
}

// TestMetricsCountAFailedAcquisitionAsError: an Acquire that fails for another reason than
// a busy semaphore or its ctx (more units than etcd's limit, which the handle learns from
// etcd) is an error outcome, and its span is marked as an error.
func TestMetricsCountAFailedAcquisitionAsError(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(testContext(t), "request")
	r := mt.NewReader(t)
	const name = "metrics-error"
	first := newSemaphore(t, cluster.Client(t), name, 2)
	p, err := first.Acquire(ctx) // records the limit 2
	require.NoError(t, err)
	other := newSemaphore(t, cluster.Client(t), name, 3, semaphore.WithMeterProvider(r.Provider))
	_, err = other.AcquireN(ctx, 3) // learns etcd's limit, 2, once under way
	require.ErrorIs(t, err, semaphore.ErrInvalidOption)
	require.NoError(t, p.Release(ctx))
	parent.End()

	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, mt.Primitive.String("semaphore"), mt.Outcome.String("error")))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration), "nothing else")
	assert.EqualValues(t, 0, d.Count(mt.HoldDuration))
	assert.EqualValues(t, 0, d.Sum(mt.Waiters), "waiters back to zero")
	assert.Equal(t, []string{"acquired"}, mt.Outcomes(sr, "etcdsync.semaphore.Acquire"))
	assert.Equal(t, []string{"error"}, mt.Outcomes(sr, "etcdsync.semaphore.AcquireN"))
	for _, s := range sr.Ended() {
		if s.Name() == "etcdsync.semaphore.AcquireN" && s.Status().Code == codes.Error {
			assert.Contains(t, s.Status().Description, "over the limit of 2")
			return
		}
	}
	t.Error("no Acquire span has an error status")
}

// TestMetricsCountAWeightedPermitAsOneHold: a permit of 3 units is one acquisition and one
// hold, a try for 2 with 1 free is busy, units out of range are no acquisition at all; the
// spans are AcquireN's and TryAcquireN's.
func TestMetricsCountAWeightedPermitAsOneHold(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(testContext(t), "request")
	r := mt.NewReader(t)
	prim := mt.Primitive.String("semaphore")
	s := newSemaphore(t, cluster.Client(t), "metrics-weighted", 4, semaphore.WithMeterProvider(r.Provider))

	p, err := s.AcquireN(ctx, 3)
	require.NoError(t, err)
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Holds, prim), "one hold of 3 units")
	_, err = s.TryAcquireN(ctx, 2)
	require.ErrorIs(t, err, semaphore.ErrNoPermits)
	wctx, cancel := context.WithCancel(ctx)
	waited := acquireNAsync(wctx, s, 2)
	awaitPermits(t, cluster.Client(t), "metrics-weighted", 2)
	cancel()
	require.ErrorIs(t, etcdtest.Within(t, waited, 10*time.Second, "the cancelled AcquireN").err, context.Canceled)
	_, err = s.AcquireN(ctx, 5)
	require.ErrorIs(t, err, semaphore.ErrInvalidOption)
	require.NoError(t, p.Release(ctx))
	parent.End()

	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("acquired")))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("busy")))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("canceled")))
	assert.EqualValues(t, 3, d.Count(mt.AcquireDuration), "nothing else: bad input is no acquisition")
	n, ahead := d.Histogram(mt.QueueAhead, prim)
	assert.EqualValues(t, 2, n, "two AcquireN joined the line")
	assert.EqualValues(t, 3, ahead, "the first found nothing ahead, the second 3 units")
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, mt.Outcome.String("released")))
	assert.EqualValues(t, 0, d.Sum(mt.Holds), "holds back to zero")
	assert.Equal(t, []string{"acquired", "canceled"}, mt.Outcomes(sr, "etcdsync.semaphore.AcquireN"))
	enqueued := 0
	for _, span := range sr.Ended() {
		for _, ev := range span.Events() {
			if span.Name() == "etcdsync.semaphore.AcquireN" && ev.Name == "etcdsync.enqueued" {
				enqueued++
			}
		}
	}
	assert.Equal(t, 2, enqueued, "each AcquireN span says where it joined the line")
	assert.Equal(t, []string{"busy"}, mt.Outcomes(sr, "etcdsync.semaphore.TryAcquireN"))
	assert.Empty(t, mt.Outcomes(sr, "etcdsync.semaphore.Acquire"))
}
