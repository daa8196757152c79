package mutex_test

import (
	"context"
	"testing"
	"time"

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
