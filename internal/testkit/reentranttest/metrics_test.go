package reentrant_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	mt "github.com/etcdsync/etcdsync/internal/testkit/metrictest"
	"github.com/etcdsync/etcdsync/reentrant"
)

// TestMetricsCountTheOutermostHold: a Lock that re-enters is no acquisition and no span;
// the hold lasts from the outermost Lock to the last Unlock, whose span is the release.
func TestMetricsCountTheOutermostHold(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(etcdtest.Context(t), "request")
	r := mt.NewReader(t)
	const name = "metrics-outermost"
	prim := mt.Primitive.String("reentrant")
	m := newMutex(t, cluster.Client(t), name, reentrant.WithMeterProvider(r.Provider))
	other := newMutex(t, cluster.Client(t), name, reentrant.WithMeterProvider(r.Provider))

	owner, err := m.Lock(ctx)
	require.NoError(t, err)
	inner, err := m.Lock(owner)
	require.NoError(t, err)
	_, err = other.TryLock(ctx)
	require.ErrorIs(t, err, reentrant.ErrLocked)
	require.NoError(t, m.Unlock(inner))
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Holds, prim), "held until the last Unlock")
	require.NoError(t, m.Unlock(owner))
	parent.End()

	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("acquired")))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("busy")))
	assert.EqualValues(t, 2, d.Count(mt.AcquireDuration), "nothing else")
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, mt.Outcome.String("released")))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration), "nothing else")
	assert.EqualValues(t, 0, d.Sum(mt.Holds), "holds back to zero")
	assert.EqualValues(t, 0, d.Sum(mt.Waiters), "waiters back to zero")

	assert.Equal(t, []string{"acquired"}, mt.Outcomes(sr, "etcdsync.reentrant.Lock"))
	assert.Equal(t, []string{"busy"}, mt.Outcomes(sr, "etcdsync.reentrant.TryLock"))
	assert.Equal(t, []string{"released"}, mt.Outcomes(sr, "etcdsync.reentrant.Unlock"))
}

// TestMetricsFollowAGlobalProviderSetAfterNew: a handle made before otel.SetMeterProvider,
// without WithMeterProvider, records through the provider set later. (otel delegates its
// default provider once per process, so this is the only test here that sets one.)
func TestMetricsFollowAGlobalProviderSetAfterNew(t *testing.T) {
	ctx := etcdtest.Context(t)
	m := newMutex(t, cluster.Client(t), "metrics-global-later")
	r := mt.NewReader(t)
	otel.SetMeterProvider(r.Provider)
	t.Cleanup(func() { otel.SetMeterProvider(metricnoop.NewMeterProvider()) })

	owner, err := m.Lock(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Unlock(owner))

	d := r.Collect(t)
	prim := mt.Primitive.String("reentrant")
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("acquired")))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, mt.Outcome.String("released")))
}
