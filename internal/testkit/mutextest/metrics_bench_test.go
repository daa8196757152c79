package mutex_test

import (
	"context"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
)

// BenchmarkUncontendedCycle: one handle's Lock+Unlock with the global providers unset, so
// that nothing listens: what the instrumentation costs then (compare with a build without
// it, in the same run), in time and allocations per cycle.
func BenchmarkUncontendedCycle(b *testing.B) {
	ctx := context.Background()
	cli, _ := benchClient(b)
	m, err := mutex.New(cli, benchName("cycle"))
	if err != nil {
		b.Fatal(err)
	}
	mustLock(b, ctx, m) // the first use grants the lease
	mustUnlock(b, ctx, m)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		mustLock(b, ctx, m)
		mustUnlock(b, ctx, m)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "us/cycle")
}

// BenchmarkQuietTelemetry: uncontended Lock+Unlock cycles of three handles, in turn, cycle
// by cycle on the same server: one without telemetry (as before it existed), one
// with the global providers unset and one with the no-op MeterProvider. It reports each
// one's time per cycle and the instrumented ones' against the one without.
func BenchmarkQuietTelemetry(b *testing.B) {
	ctx := context.Background()
	sides := []struct {
		name string
		opts []mutex.Option
	}{
		{"without", []mutex.Option{core.WithoutTelemetry()}},
		{"global", nil},
		{"noop", []mutex.Option{mutex.WithMeterProvider(metricnoop.NewMeterProvider())}},
	}
	handles := make([]*mutex.Mutex, len(sides))
	spent := make([]time.Duration, len(sides))
	for i, s := range sides {
		cli, _ := benchClient(b)
		m, err := mutex.New(cli, benchName("quiet"), s.opts...)
		if err != nil {
			b.Fatal(err)
		}
		mustLock(b, ctx, m)
		mustUnlock(b, ctx, m)
		handles[i] = m
	}
	b.ResetTimer()
	for n := range b.N {
		for k := range handles {
			i := (n + k) % len(handles) // each goes first in turn: no side gains by its place
			start := time.Now()
			mustLock(b, ctx, handles[i])
			mustUnlock(b, ctx, handles[i])
			spent[i] += time.Since(start)
		}
	}
	b.StopTimer()
	for i, s := range sides {
		b.ReportMetric(float64(spent[i].Microseconds())/float64(b.N), s.name+"-us/cycle")
		if i > 0 {
			b.ReportMetric(float64(spent[i])/float64(spent[0]), s.name+"-vs-without")
		}
	}
}
