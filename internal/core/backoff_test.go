package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/etcdsync/etcdsync/internal/core"
)

// TestBackoffDoublesWithJitterUpToItsMax: each delay is drawn from [½, 1½] of a step that
// starts at Initial and doubles up to Max, and is never above Max; the zero value starts at
// 25 ms and stops growing at 1 s.
func TestBackoffDoublesWithJitterUpToItsMax(t *testing.T) {
	for _, tc := range []struct {
		desc         string
		b            core.Backoff
		initial, max time.Duration
	}{
		{"zero value", core.Backoff{}, 25 * time.Millisecond, time.Second},
		{"trylock's default", core.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}, 100 * time.Millisecond, 2 * time.Second},
		{"initial equal to max", core.Backoff{Initial: time.Second, Max: time.Second}, time.Second, time.Second},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			for range 50 { // the jitter is random: draw many sequences
				b := tc.b
				step := tc.initial
				for i := range 12 {
					d := b.Next()
					assert.GreaterOrEqual(t, d, step/2, "delay %d", i)
					assert.LessOrEqual(t, d, min(step+step/2, tc.max), "delay %d", i)
					step = min(2*step, tc.max)
				}
			}
		})
	}
}
