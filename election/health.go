package election

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
)

// RunOption configures [Election.Run].
type RunOption func(*runConfig)

type runConfig struct {
	check checker
}

// WithHealthCheck makes [Election.Run] call check every every while it leads: the first
// failure ends lead's ctx (its cause wraps check's error), and once lead has returned Run
// resigns, then campaigns again only when check passes (it is called every every until it
// does). A check that has not returned within every has failed: its ctx, which also ends
// with lead's, has a deadline of every, and a check that ignores it is not waited for (the
// next call waits up to every for it, and fails if it still runs). every <= 0 or a nil check
// makes Run return [ErrInvalidOption].
func WithHealthCheck(every time.Duration, check func(ctx context.Context) error) RunOption {
	return func(c *runConfig) { c.check = checker{every: every, check: check} }
}

// errUnhealthy is the cause of lead's ctx when a health check failed.
var errUnhealthy = errors.New("election: the health check failed")

// errCheckLate is the failure of a check that did not return within its period.
var errCheckLate = errors.New("election: the health check did not return within its period")

// A checker calls the health check with a deadline of one period. A call that has not
// returned by then has failed, and is abandoned rather than waited for: a check that ignores
// its ctx must not keep a leader leading, nor a stopped Run from returning. Its goroutine
// ends when the check returns; the next call waits for that first.
type checker struct {
	every time.Duration
	check func(ctx context.Context) error
	late  chan error // the abandoned call's result, while it runs; nil without one
}

// call runs the check once: nil if it passed, its error, errCheckLate, or ctx's error once
// ctx has ended. It returns within a period of the call, or of ctx's end.
func (c *checker) call(ctx context.Context) error {
	if c.late != nil {
		wait := time.NewTimer(c.every)
		defer wait.Stop()
		select {
		case <-c.late:
			c.late = nil
		case <-wait.C:
			return fmt.Errorf("%w: the check before it still runs", errCheckLate)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cctx, cancel := context.WithTimeoutCause(ctx, c.every, errCheckLate)
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- c.check(cctx) }()
	select {
	case err := <-result:
		return err
	case <-cctx.Done():
	}
	select {
	case err := <-result: // it returned as its deadline passed
		return err
	default:
		c.late = result
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errCheckLate
}

// lead runs lead under the health check, if any: it returns whether a check failed (lead's
// ctx then ended with errUnhealthy as its cause), and lead's error.
func (c *runConfig) lead(ctx context.Context, lead func(context.Context) error) (unhealthy bool, err error) {
	if c.check.check == nil {
		return false, lead(ctx)
	}
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	failed := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(c.check.every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if cerr := c.check.call(hctx); cerr != nil && hctx.Err() == nil {
					close(failed)
					cancel(fmt.Errorf("%w: %w", errUnhealthy, cerr))
					return
				}
			case <-hctx.Done():
				return
			}
		}
	}()
	err = lead(hctx)
	cancel(nil)
	<-stopped // within a period: call abandons a check that outlives it
	select {
	case <-failed:
		return true, err
	default:
		return false, err
	}
}

// awaitHealthy returns once the health check passes (at once without one), or ctx's error.
func (c *runConfig) awaitHealthy(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.check.check == nil || c.check.call(ctx) == nil {
			return nil
		}
		if err := core.Pause(ctx, c.check.every); err != nil {
			return err
		}
	}
}
