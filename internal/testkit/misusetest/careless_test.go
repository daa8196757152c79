package misusetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestEveryCallHoldsUpUnderCarelessUse runs every exported method of every handle type, and
// trylock's functions over every Locker, in each situation: on a zero value and on a nil
// pointer (New never made them), on a fresh handle with a context already done, and on a
// fresh handle whose client is closed. Each call must return within a second with what its
// kind calls for in the situation (see situations), must not panic, and must write
// nothing.
func TestEveryCallHoldsUpUnderCarelessUse(t *testing.T) {
	admin := cluster.Client(t)
	for _, s := range situations {
		t.Run(s.name, func(t *testing.T) {
			for _, p := range primitives {
				calls := s.calls(t, p, admin)
				if calls == nil {
					continue
				}
				t.Run(p.name, func(t *testing.T) {
					before := etcdtest.Revision(t, admin)
					for _, c := range calls {
						checkCall(t, c, s.ctx(t), s.within, s.want(c))
					}
					etcdtest.NoWrites(t, admin, before, "written to etcd")
				})
			}
		})
	}
}

// checkCall runs c on ctx and checks that it returns within d, without panicking, an error
// matching every error of want (any error for errAny; nil for none).
func checkCall(t *testing.T, c call, ctx context.Context, d time.Duration, want []error) {
	t.Helper()
	type result struct {
		err      error
		panicked any
	}
	out := make(chan result, 1)
	start := time.Now()
	go func() {
		defer func() {
			if p := recover(); p != nil {
				out <- result{panicked: p}
			}
		}()
		out <- result{err: c.run(ctx)}
	}()
	var r result
	select {
	case r = <-out:
	case <-time.After(d):
		t.Errorf("%s: still running after %v", c.name, d)
		return
	}
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case r.panicked != nil:
		t.Errorf("%s: panicked: %v", c.name, r.panicked)
	case len(want) == 0:
		assert.NoError(t, r.err, "%s (%v)", c.name, took)
	case len(want) == 1 && errors.Is(want[0], errAny):
		assert.Error(t, r.err, "%s (%v)", c.name, took)
	default:
		for _, w := range want {
			assert.ErrorIs(t, r.err, w, "%s (%v)", c.name, took)
		}
	}
}
