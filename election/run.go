package election

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
)

// runPause is how long Run waits before it campaigns again after a campaign failed with
// ErrLost (an outage let the session's lease run out): it then takes a new lease.
const runPause = 500 * time.Millisecond

// Run is the leader loop: it campaigns with value and, once leading, calls lead with a ctx
// that ends as soon as the leadership ends (lost: context.Cause matches [ErrLost]; resigned
// by another call: it matches [ErrNotLocked]), it is to move (a [Election.Transfer], a
// request, a more preferred candidate: [Election.Asked]; the cause matches ErrNotLocked), or
// ctx ends; after lead returns (never before: leadership is kept while lead runs), it
// resigns, or hands the leadership over, and campaigns again, until ctx ends. A campaign
// that fails with ErrLost is tried again.
//
// The term is Run's own: the handle takes no other leadership until lead has returned,
// also after a loss, and Run's resign ends that term's leadership only (see the package doc
// for Runs and Campaigns on one handle).
//
// Errors: ctx's error, wrapped, once ctx ends (after resigning if it led; within a period of
// a [WithHealthCheck] check, whatever the check does). lead's error
// when lead returns one while still leading: Run resigns and stops. [ErrInvalidOption] for a
// nil lead or a bad [WithHealthCheck], having campaigned for nothing; on an Election not
// made by [New], as Campaign. Other errors of Campaign stop it.
//
// Cost: a Campaign and a Resign per term, the watch of the leadership while lead runs, and
// the asker's read and two watches per term (see Asked).
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
	case len(opts) > 0 && (cfg.check.check == nil || cfg.check.every <= 0):
		return e.errorf("run", fmt.Errorf("%w: WithHealthCheck needs a check and a period above 0", ErrInvalidOption))
	}
	var kept *core.Hold // the last term's leadership, whose handover failed: it leads on
	for {
		if kept == nil {
			if err := cfg.awaitHealthy(ctx); err != nil {
				return e.errorf("run", err)
			}
		}
		// stop ends lead's ctx early, for a Transfer (see campaign); its own ctx only
		// signals, so that the term's release (a Transfer's handover) runs on Run's ctx.
		sctx, stop := context.WithCancelCause(context.Background())
		h, err := kept, error(nil)
		if !e.resume(kept, stop) {
			h, err = e.campaign(ctx, value, stop)
		}
		kept = nil
		if err != nil {
			stop(nil)
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
		// A request to move the leadership, or a more preferred candidate (ask.go), ends the
		// term as a Transfer does.
		termOver, yielded := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(yielded)
			if k := e.asking(h); k != nil {
				select {
				case <-k.asked:
					_ = e.yield(ctx, h, k)
				case <-termOver:
				}
			}
		}()
		unhealthy, resigned, transferred := false, false, false
		var leadErr error
		err = core.Scoped(ctx, h, func(lctx context.Context) error {
			lctx, cancel := context.WithCancelCause(lctx)
			defer cancel(nil)
			defer context.AfterFunc(sctx, func() { cancel(context.Cause(sctx)) })()
			unhealthy, leadErr = cfg.lead(lctx, lead)
			resigned = errors.Is(context.Cause(lctx), core.ErrReleasedEarly)
			transferred = errors.Is(context.Cause(lctx), errTransferring)
			return leadErr
		}, func(ctx context.Context) error { return e.endTerm(ctx, h) })
		stop(nil)
		close(termOver)
		<-yielded
		if transferred {
			err = nil // lead's error, and the handover's, are the Transfer's to report
		}
		if transferred && e.takeKept(h) {
			// The handover failed, and the leadership is still this Run's: lead on with it.
			if ctx.Err() == nil {
				kept = h
				continue
			}
			rctx, cancel := core.Detached(ctx)
			_ = e.resign(rctx, h)
			cancel()
		}
		why := stepDownOf(ctx, err, leadErr, unhealthy, resigned, transferred)
		e.s.Tel.SteppedDown(context.WithoutCancel(ctx), why)
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
// loss (or a Resign by another call while lead ran: to Run, its leadership was gone), a
// failed health check, lead's error, or lead returning nil. Only lead's error while leading
// stops Run: a resign that failed after lead returned nil is no reason to stop campaigning.
func stepDownOf(ctx context.Context, err, leadErr error, unhealthy, resigned, transferred bool) core.StepDown {
	switch {
	case ctx.Err() != nil:
		return core.StepDownCanceled
	case transferred:
		return core.StepDownTransferred
	case errors.Is(err, ErrLost) || resigned:
		return core.StepDownLost
	case unhealthy:
		return core.StepDownUnhealthy
	case leadErr != nil:
		return core.StepDownError
	}
	return core.StepDownReturned
}
