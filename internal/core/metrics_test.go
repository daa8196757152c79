package core_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/etcdsync/etcdsync/internal/core"
)

// quietTelemetry are Telemetries with nothing listening: the global providers unset, and
// the no-op MeterProvider.
func quietTelemetry(tb testing.TB) map[string]*core.Telemetry {
	tels := map[string]*core.Telemetry{}
	for name, opts := range map[string][]core.Option{
		"global": nil,
		"noop":   {core.WithMeterProvider(metricnoop.NewMeterProvider()), core.WithNameAttribute()},
	} {
		cfg, err := core.Options(opts)
		require.NoError(tb, err)
		tels[name] = core.NewTelemetry(cfg, core.PrimitiveMutex, "quiet")
	}
	return tels
}

// instrumentedCycle is what a Lock and an Unlock do with their Telemetry, around the etcd
// calls.
func instrumentedCycle(ctx context.Context, tel *core.Telemetry) {
	lctx, a := tel.BeginWait(ctx, "etcdsync.mutex.Lock")
	tel.Enqueued(lctx, 0, 1)
	a.Held(nil)
	a.End(nil)
	_, r := tel.BeginRelease(lctx, "etcdsync.mutex.Unlock")
	r.End(nil)
}

// TestTelemetryAllocatesNothingWhenNobodyListens: with nothing listening, an acquisition's
// and a release's recording allocate nothing.
func TestTelemetryAllocatesNothingWhenNobodyListens(t *testing.T) {
	ctx := context.Background()
	for name, tel := range quietTelemetry(t) {
		allocs := testing.AllocsPerRun(1000, func() { instrumentedCycle(ctx, tel) })
		assert.Zero(t, allocs, "%s: allocations per cycle", name)
		allocs = testing.AllocsPerRun(1000, func() {
			_, a := tel.BeginTry(ctx, "etcdsync.mutex.TryLock")
			a.End(core.ErrLocked)
		})
		assert.Zero(t, allocs, "%s: allocations per failed try", name)
	}
}

// TestOptionsRefuseANilMeterProvider: WithMeterProvider(nil) is an invalid option.
func TestOptionsRefuseANilMeterProvider(t *testing.T) {
	_, err := core.Options([]core.Option{core.WithMeterProvider(nil)})
	assert.ErrorIs(t, err, core.ErrInvalidOption)
}

// BenchmarkQuietRecording: what one Lock+Unlock cycle's recording costs with nothing
// listening, next to the cycle itself (hundreds of microseconds, mutex's
// BenchmarkQuietTelemetry).
func BenchmarkQuietRecording(b *testing.B) {
	ctx := context.Background()
	for name, tel := range quietTelemetry(b) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				instrumentedCycle(ctx, tel)
			}
		})
	}
}
