package faulttest

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// changer is a Locker whose holds change in place (an rwmutex's): a write hold that
// becomes a read (Downgrade, released by RUnlock), and an upgradable read (ULock) that
// becomes the write hold (Upgrade) or is released as it is (UUnlock).
type changer interface {
	Downgrade(ctx context.Context) error
	RUnlock(ctx context.Context) error
	ULock(ctx context.Context) error
	Upgrade(ctx context.Context) error
	UUnlock(ctx context.Context) error
}

// The explorer records a hold that changes in place as two holds, one after the other,
// which the checks already know: a write hold (Acquire, Release) and a read hold
// (ReadAcquire, ReadRelease) of the same worker. A downgrade ends the write hold at its
// call (the worker's writes are done by then; readers are let in only once it is applied)
// and starts the read hold at its return. An upgradable read is a read hold from ULock's
// return to Upgrade's (it holds beside readers, never beside a writer), and the write hold
// it becomes an Acquire at Upgrade's return, with its token. So a reader served beside a
// writer, a token out of order, or a write hold beside another is a violation as ever.

// exploreDowngrade ends the write hold token of wk by a Downgrade, then holds the read for
// a while and releases it. A Downgrade that says the hold was lost changes nothing: the
// hold is released (Unlock) as ever.
func (r *Run) exploreDowngrade(wk *worker, c changer, token int64, rng *rand.Rand) {
	op := Op{Worker: wk.id, Kind: Release, Token: token, Call: r.hist.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	err := c.Downgrade(ctx)
	cancel()
	op.Return = r.hist.Now()
	switch {
	case errors.Is(err, r.w.Lost):
		r.release(wk, token)
		return
	case err != nil:
		op.Outcome, op.Err = Ambiguous, err // a read hold all the same: applied or not
	default:
		op.Outcome = OK
		r.changed.Add(1)
	}
	r.hist.add(op)
	r.hist.add(Op{Worker: wk.id, Kind: ReadAcquire, Call: op.Call, Return: r.hist.Now()})
	r.changedRead(wk, c.RUnlock, rng)
}

// changedRead is the read hold of a change: a read of the register, a pause now and then,
// and its release (RUnlock, or UUnlock), retried until its outcome is known. A handle whose
// release got no answer is replaced.
func (r *Run) changedRead(wk *worker, release func(context.Context) error, rng *rand.Rand) {
	r.readUnderHold(&reader{id: wk.id, cli: wk.cli})
	if rng.IntN(2) == 0 {
		r.wait(time.Duration(rng.IntN(50)) * time.Millisecond)
	}
	op := Op{Worker: wk.id, Kind: ReadRelease, Call: r.hist.Now()}
	op.Outcome, op.Err = r.unlockUntilKnown(release)
	op.Return = r.hist.Now()
	if op.Outcome == Ambiguous {
		r.unknownRelease(wk, &op)
	}
	r.hist.add(op)
}

// exploreUpgrade is one cycle of an upgradable read: ULock, a read, and then either its
// release as a read (UUnlock), or Upgrade, the fenced writes and Unlock. An Upgrade that
// fails leaves an upgradable read (or a lost one), released as a read.
func (r *Run) exploreUpgrade(ctx context.Context, wk *worker, c changer, rng *rand.Rand, call time.Duration) {
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	err := c.ULock(lctx)
	cancel()
	if err != nil {
		r.hist.lockFailed(wk.id, ReadAcquire, call, err)
		r.wait(time.Duration(rng.IntN(50)) * time.Millisecond)
		return
	}
	r.hist.add(Op{Worker: wk.id, Kind: ReadAcquire, Call: call, Return: r.hist.Now()})
	r.readUnderHold(&reader{id: wk.id, cli: wk.cli})
	if rng.IntN(3) == 0 {
		r.changedRead(wk, c.UUnlock, rng)
		return
	}
	up := r.hist.Now()
	uctx, cancel := context.WithTimeout(ctx, time.Duration(100+rng.IntN(lockTimeoutMillis()))*time.Millisecond)
	err = c.Upgrade(uctx)
	cancel()
	switch {
	case err != nil:
		// Lost (UUnlock then says so, and frees the handle), or an upgradable read again.
		r.changedRead(wk, c.UUnlock, rng)
		return
	}
	r.changed.Add(1)
	// The read ended as the write began: a write hold from the Upgrade's call on.
	r.hist.add(Op{Worker: wk.id, Kind: ReadRelease, Call: up, Return: r.hist.Now(), Outcome: OK})
	token := wk.lk.Token()
	r.hist.add(Op{Worker: wk.id, Kind: Acquire, Token: token, Call: up, Return: r.hist.Now()})
	r.writeUnderHold(wk, token)
	r.release(wk, token)
}

// lockTimeoutMillis is lockTimeout in milliseconds: an Upgrade's ctx is drawn below it, so
// that some end while readers still hold.
func lockTimeoutMillis() int { return int(lockTimeout / time.Millisecond) }
