package rwmutex_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	mt "github.com/etcdsync/etcdsync/internal/testkit/metrictest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// TestMetricsCountAKnownWorkload: each side is its own primitive. Two RLocks of one handle
// are two acquisitions through one hold (one key); tries that find the other side held are
// busy; a Lock waiting behind the readers is a waiter until they leave; spans tell the same.
func TestMetricsCountAKnownWorkload(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(etcdtest.Context(t), "request")
	r := mt.NewReader(t)
	const name = "metrics-workload"
	read, write := mt.Primitive.String("rwmutex.read"), mt.Primitive.String("rwmutex.write")
	acquired, busy, released := mt.Outcome.String("acquired"), mt.Outcome.String("busy"), mt.Outcome.String("released")
	cli := cluster.Client(t)
	readers := newRW(t, cli, name, rwmutex.WithMeterProvider(r.Provider))
	writer := newRW(t, cluster.Client(t), name, rwmutex.WithMeterProvider(r.Provider))
	late := newRW(t, cluster.Client(t), name, rwmutex.WithMeterProvider(r.Provider))

	require.NoError(t, readers.RLock(ctx))
	require.NoError(t, readers.RLock(ctx))
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Holds, read), "two readers of a handle, one hold")
	require.ErrorIs(t, writer.TryLock(ctx), rwmutex.ErrLocked)
	locked := etcdtest.Async(func() error { return writer.Lock(ctx) })
	primtest.AwaitKeys(t, cli, name, 2)
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Waiters, write), "the writer waits")
	require.NoError(t, readers.RUnlock(ctx))
	require.NoError(t, readers.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, 10*time.Second, "the writer, once the readers left"))
	require.ErrorIs(t, late.TryRLock(ctx), rwmutex.ErrLocked)
	require.NoError(t, writer.Unlock(ctx))
	parent.End()

	d := r.Collect(t)
	assert.EqualValues(t, 2, d.Count(mt.AcquireDuration, read, acquired))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, read, busy))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, write, acquired))
	assert.EqualValues(t, 1, d.Count(mt.AcquireDuration, write, busy))
	assert.EqualValues(t, 5, d.Count(mt.AcquireDuration), "nothing else")
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, read, released))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, write, released))
	assert.EqualValues(t, 2, d.Count(mt.HoldDuration), "nothing else")
	assert.EqualValues(t, 0, d.Sum(mt.HoldLost))
	assert.EqualValues(t, 0, d.Sum(mt.Holds), "holds back to zero")
	assert.EqualValues(t, 0, d.Sum(mt.Waiters), "waiters back to zero")

	assert.Equal(t, []string{"acquired", "acquired"}, mt.Outcomes(sr, "etcdsync.rwmutex.RLock"))
	assert.Equal(t, []string{"busy"}, mt.Outcomes(sr, "etcdsync.rwmutex.TryRLock"))
	assert.Equal(t, []string{"released", "released"}, mt.Outcomes(sr, "etcdsync.rwmutex.RUnlock"))
	assert.Equal(t, []string{"busy"}, mt.Outcomes(sr, "etcdsync.rwmutex.TryLock"))
	assert.Equal(t, []string{"acquired"}, mt.Outcomes(sr, "etcdsync.rwmutex.Lock"))
	assert.Equal(t, []string{"released"}, mt.Outcomes(sr, "etcdsync.rwmutex.Unlock"))
}
