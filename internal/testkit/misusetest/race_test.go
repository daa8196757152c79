package misusetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestASecondReleaseWaitsForTheFirstOutcome: two releases of one hold race (two
// goroutines that both let go, one of them perhaps in a defer). The first one's delete
// gets no answer until its ctx has ended, so it fails and the hold stays. The second,
// meanwhile, must not say ErrNotLocked while the hold may stay: it waits for the first,
// then releases the hold itself.
func TestASecondReleaseWaitsForTheFirstOutcome(t *testing.T) {
	for _, k := range holdKinds {
		t.Run(k.name, func(t *testing.T) {
			var inj etcdtest.Injector
			name := "misuse-release-race-" + k.name
			h := k.take(t, etcdtest.Context(t), inj.Client(t, cluster), name)

			sent, answer := make(chan struct{}, 1), make(chan struct{})
			stuck := inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(k.prefix(name)),
				Action: etcdtest.Hold, Until: answer, Matched: func() { signal(sent) }})
			ctx, cancel := context.WithCancel(etcdtest.Context(t))
			first := etcdtest.Async(func() error { return h.release(ctx) })
			etcdtest.Within(t, sent, 10*time.Second, "the first release's delete")
			second := etcdtest.Async(func() error { return h.release(etcdtest.Context(t)) })
			select {
			case err := <-second:
				t.Fatalf("the second release returned (%v) while the first was under way", err)
			case <-time.After(300 * time.Millisecond):
			}
			cancel()
			// No answer comes to the first: it fails once its ctx, and any grace after it,
			// ends (for reentrant, 5 s after ctx: see reentrant.Mutex.Unlock).
			assert.Error(t, etcdtest.Within(t, first, 10*time.Second, "the first release"), "the first release")
			stuck()
			close(answer) // a try of the second's that came in between goes through
			assert.NoError(t, etcdtest.Within(t, second, 10*time.Second, "the second release"), "the second release")
			assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), k.prefix(name)), "keys left")
			assert.ErrorIs(t, h.release(etcdtest.Context(t)), core.ErrNotLocked, "a third release")
		})
	}
}

// signal sends on ch without blocking.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
