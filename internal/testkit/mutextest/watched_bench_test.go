package mutex_test

import (
	"context"
	"testing"

	"github.com/etcdsync/etcdsync/mutex"
)

// BenchmarkWatchedCycle: uncontended Lock, Done, Unlock cycles of one client: what a hold
// whose loss someone follows (Do, a leader's term) costs beyond a plain cycle. It reports
// the RPCs per cycle; a watch opened or cancelled counts as a Watch.send.
func BenchmarkWatchedCycle(b *testing.B) {
	ctx := context.Background()
	cli, cnt := benchClient(b)
	m, err := mutex.New(cli, benchName("watched"))
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil { // the first use grants the lease
		b.Fatal(err)
	}
	<-closedOnUnlock(b, ctx, m)
	before := cnt.Counts()
	b.ResetTimer()
	for range b.N {
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		<-closedOnUnlock(b, ctx, m)
	}
	b.StopTimer()
	reportRPCs(b, "", cnt.Counts().Sub(before), b.N)
}

// closedOnUnlock calls m's Done, unlocks m, and returns the Done, which Unlock has closed.
func closedOnUnlock(b *testing.B, ctx context.Context, m *mutex.Mutex) <-chan struct{} {
	done := m.Done()
	if err := m.Unlock(ctx); err != nil {
		b.Fatal(err)
	}
	return done
}
