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
	every time.Duration
	check func(ctx context.Context) error
}

// WithHealthCheck makes [Election.Run] call check every every while it leads: the first
// failure ends lead's ctx (its cause wraps check's error), and once lead has returned Run
// resigns, then campaigns again only when check passes (it is called every every until it
// does). A check's ctx ends with lead's. every <= 0 or a nil check makes Run return
// [ErrInvalidOption].
func WithHealthCheck(every time.Duration, check func(ctx context.Context) error) RunOption {
	return func(c *runConfig) { c.every, c.check = every, check }
}

// errUnhealthy is the cause of lead's ctx when a health check failed.
var errUnhealthy = errors.New("election: the health check failed")

// runPause is how long Run waits before it campaigns again after a campaign failed with
// ErrLost (an outage let the session's lease run out): it then takes a new lease.
const runPause = 500 * time.Millisecond

// Run is the leader loop: it campaigns with value and, once leading, calls lead with a ctx
// that ends as soon as the leadership is lost (context.Cause matches [ErrLost]) or ctx ends;
// after lead returns (never before: leadership is kept while lead runs), it resigns and
// campaigns again, until ctx ends. A campaign that fails with ErrLost is tried again.
//
// Errors: ctx's error, wrapped, once ctx ends (after resigning if it led). lead's error
// when lead returns one while still leading: Run resigns and stops. [ErrInvalidOption] for a
// nil lead or a bad [WithHealthCheck], having campaigned for nothing; on an Election not
// made by [New], as Campaign. Other errors of Campaign stop it.
//
// Cost: a Campaign and a Resign per term, and the watch of the leadership while lead runs.
func (e *Election) Run(ctx context.Context, value string, lead func(ctx context.Context) error, opts ...RunOption) error {
	var cfg runConfig
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	switch {
	case lead == nil:
		return e.errorf("run", fmt.Errorf("%w: lead is nil", ErrInvalidOption))
	case len(opts) > 0 && (cfg.check == nil || cfg.every <= 0):
		return e.errorf("run", fmt.Errorf("%w: WithHealthCheck needs a check and a period above 0", ErrInvalidOption))
	}
	for {
		if err := cfg.awaitHealthy(ctx); err != nil {
			return e.errorf("run", err)
		}
		if err := e.Campaign(ctx, value); err != nil {
			switch {
			case ctx.Err() != nil:
				return e.errorf("run", ctx.Err())
			case !errors.Is(err, ErrLost):
				return err
			}
			if err := core.Pause(ctx, runPause); err != nil {
				return e.errorf("run", err)
			}
			continue
		}
		unhealthy := false
		var leadErr error
		err := core.Scoped(ctx, e.current(), func(lctx context.Context) error {
			unhealthy, leadErr = cfg.lead(lctx, lead)
			return leadErr
		}, e.Resign)
		why := stepDownOf(ctx, err, leadErr, unhealthy)
		e.tel.SteppedDown(context.WithoutCancel(ctx), why)
		switch why {
		case core.StepDownCanceled:
			return e.errorf("run", ctx.Err())
		case core.StepDownError:
			return err
		}
		// Lost, stepped down, or lead returned nil: campaign again (once healthy). A resign
		// that got no answer goes on in the background (see Do), and the next Campaign of
		// this handle waits for it.
	}
}

// stepDownOf says why a term ended, from the term's error err and lead's own: ctx's end, a
// loss, a failed health check, lead's error, or lead returning nil. Only lead's error stops
// Run: a resign that failed after lead returned nil is no reason to stop campaigning.
func stepDownOf(ctx context.Context, err, leadErr error, unhealthy bool) core.StepDown {
	switch {
	case ctx.Err() != nil:
		return core.StepDownCanceled
	case errors.Is(err, ErrLost):
		return core.StepDownLost
	case unhealthy:
		return core.StepDownUnhealthy
	case leadErr != nil:
		return core.StepDownError
	}
	return core.StepDownReturned
}

// lead runs lead under the health check, if any: it returns whether a check failed (lead's
// ctx then ended with errUnhealthy as its cause), and lead's error.
func (c *runConfig) lead(ctx context.Context, lead func(context.Context) error) (unhealthy bool, err error) {
	if c.check == nil {
		return false, lead(ctx)
	}
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	failed := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(c.every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if cerr := c.check(hctx); cerr != nil && hctx.Err() == nil {
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
	<-stopped
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
		if c.check == nil || c.check(ctx) == nil {
			return nil
		}
		if err := core.Pause(ctx, c.every); err != nil {
			return err
		}
	}
}
