package faulttest

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/etcdsync/etcdsync/election"
)

// doer is a Locker that runs work scoped to a hold (Do), whose Token and IsOwner are those
// of that hold while the work runs.
type doer interface {
	Do(ctx context.Context, fn func(ctx context.Context) error) error
}

// leaderLoop is a Locker whose leadership has a leader loop (an election's Run), whose
// Token and IsOwner are those of the term while lead runs.
type leaderLoop interface {
	Run(ctx context.Context, value string, lead func(ctx context.Context) error, opts ...election.RunOption) error
}

// errTermDone is what the explorer's lead returns once its term's writes are made: Run then
// resigns and returns it, unless the term was lost, when Run campaigns again.
var errTermDone = errors.New("faulttest: the term's work is done")

// errTermLost is the error of the release of a term after which Run campaigned again: it
// does so after lead returned an error only when the term was lost before its resign.
var errTermLost = errors.New("faulttest: lost before the resign (Run campaigned again)")

// exploreDo is one cycle through Do: the acquisition, then, inside fn, Done and Err now and
// then and the fenced writes; the release is Do's own. Its outcome is Do's: nil released,
// an error matching Lost a hold lost before its release, another error unknown (the handle
// is then replaced, as after an Unlock without an answer).
func (r *Run) exploreDo(ctx context.Context, wk *worker, d doer, rng *rand.Rand, call time.Duration) {
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	var token int64
	var releaseCall time.Duration
	entered := false
	err := d.Do(lctx, func(context.Context) error {
		entered = true
		token = r.scopedHold(wk, rng, call)
		releaseCall = r.hist.Now()
		return nil
	})
	if !entered {
		r.hist.lockFailed(wk.id, Acquire, call, err)
		r.wait(time.Duration(rng.IntN(50)) * time.Millisecond)
		return
	}
	op := Op{Worker: wk.id, Kind: Release, Token: token, Call: releaseCall, Return: r.hist.Now(), Err: err}
	switch {
	case err == nil:
		op.Outcome = OK
	case errors.Is(err, r.w.Lost):
		op.Outcome = Refused
	default:
		r.unknownRelease(wk, &op)
	}
	r.hist.add(op)
}

// exploreRun is one cycle through an election's Run: each term's lead makes the fenced
// writes (and asks Done and Err now and then) and returns errTermDone. By Run's contract a
// lead that returns an error while still leading stops it; so when Run calls lead once
// more, the term before was lost before its resign got through: its release is recorded as
// refused, and the next term is a hold of its own. Run's return settles the last term:
// errTermDone alone says the resign got through, so the term held until lead returned; any
// other error (ctx's end, a resign without an answer) leaves it unknown, and the handle is
// replaced. TestExploreRunRecordsEveryTerm holds Run to what this relies on.
func (r *Run) exploreRun(ctx context.Context, wk *worker, l leaderLoop, rng *rand.Rand, call time.Duration) {
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	var release *Op // of the last term, once its lead returned
	err := l.Run(lctx, "run-"+strconv.Itoa(wk.id), func(context.Context) error {
		if release != nil {
			release.Outcome, release.Return, release.Err = Refused, r.hist.Now(), errTermLost
			r.hist.add(*release)
			call = release.Call // the campaign of this term began once the last one's lead returned
		}
		token := r.scopedHold(wk, rng, call)
		if rng.IntN(3) == 0 {
			r.wait(time.Duration(rng.IntN(50)) * time.Millisecond) // a term that lasts: more time for a fault to end it
		}
		release = &Op{Worker: wk.id, Kind: Release, Token: token, Call: r.hist.Now()}
		return errTermDone
	})
	if release == nil {
		r.hist.lockFailed(wk.id, Acquire, call, err)
		r.wait(time.Duration(rng.IntN(50)) * time.Millisecond)
		return
	}
	op := *release
	op.Return, op.Err = r.hist.Now(), err
	if alone(err, errTermDone) {
		op.Outcome, op.Err = OK, nil
	} else {
		r.unknownRelease(wk, &op)
	}
	r.hist.add(op)
}

// scopedHold records the acquire of a hold that work scoped to it (Do's fn, Run's lead)
// was called for at call, asks Done and Err now and then, makes the fenced writes, and
// returns the hold's token.
func (r *Run) scopedHold(wk *worker, rng *rand.Rand, call time.Duration) int64 {
	token := wk.lk.Token()
	r.hist.add(Op{Worker: wk.id, Kind: Acquire, Token: token, Units: unitsOf(wk.lk), Call: call, Return: r.hist.Now()})
	r.scoped.Add(1)
	if dn, ok := wk.lk.(doner); ok && rng.IntN(2) == 0 {
		_ = dn.Done()
		_ = dn.Err()
	}
	r.writeUnderHold(wk, token)
	return token
}

// unknownRelease makes op a release whose outcome is unknown, and gives the worker a new
// handle, as after an Unlock without an answer.
func (r *Run) unknownRelease(wk *worker, op *Op) {
	op.Outcome = Ambiguous
	if lk, err := r.w.Open(wk.cli.Client, r.name); err == nil {
		wk.lk = lk
	}
}

// alone reports whether err is target and nothing else: target, or wraps and joins of it
// with no other error among them.
func alone(err, target error) bool {
	if err == target {
		return true
	}
	switch e := err.(type) {
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, x := range errs {
			if !alone(x, target) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return alone(e.Unwrap(), target)
	}
	return false
}
