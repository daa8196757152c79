package trylock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/internal/core"
)

// Locker is anything that can try to take a lock once without waiting: TryLock returns nil
// when it took it, an error matching [ErrLocked] or [ErrNoPermits] when it is busy, and any
// other error when the try itself failed.
type Locker interface {
	TryLock(ctx context.Context) error
}

// A ReleaseWatcher is a [Locker] that can tell when a busy lock may have come free, so that
// [Retry] and [Timeout] wake then instead of sleeping out their backoff. Every etcdsync
// primitive and adapter here implements it.
//
// WatchRelease starts watching. Retry calls arm before each try; the channel it returns
// yields (or is closed) when a release happened after that call, and a nil channel never
// does. A spurious yield is allowed: it only costs one more try. Retry calls stop when done.
type ReleaseWatcher interface {
	Locker
	WatchRelease() (arm func() <-chan struct{}, stop func())
}

// The errors this package returns, those of package etcdsync; compare with errors.Is.
var (
	ErrTimeout       = etcdsync.ErrTimeout
	ErrLocked        = etcdsync.ErrLocked
	ErrNoPermits     = etcdsync.ErrNoPermits
	ErrInvalidOption = etcdsync.ErrInvalidOption
)

// Once tries l once: l.TryLock(ctx), for symmetry with [Retry] and [Timeout].
//
// Errors: the try's: [ErrLocked] (or [ErrNoPermits]) when the lock is busy, having written
// nothing; ctx's error with ctx done already (every etcdsync Locker then sends nothing).
// [ErrInvalidOption] for a nil l, an l holding a nil pointer (a nil *mutex.Mutex), or an
// etcdsync primitive not made by New.
func Once(ctx context.Context, l Locker) error {
	if isNil(l) {
		return fmt.Errorf("trylock: once: %w: nil Locker", ErrInvalidOption)
	}
	return l.TryLock(ctx)
}

// Retry tries l until it takes the lock, waiting between tries for a jittered delay that
// doubles from one try to the next (see [Backoff]). If l is a [ReleaseWatcher], a release
// on the name ends the wait early, though no sooner than 10 ms after the last try (or the
// delay, if shorter), so that a name with many releases is not tried more often; a watch
// that cannot tell whether it missed a release counts as one, so the first wait on a client
// with no watch of the name open yet may end that early too. Without [Attempts],
// Retry tries until ctx ends, like a Lock: bound it with ctx's deadline, or use [Timeout].
//
// Errors: only a busy lock ([ErrLocked], [ErrNoPermits]) is tried again; any other error of a
// try is returned at once, wrapped. When ctx ends, Retry returns promptly (over an etcdsync
// Locker within the bound of a cancelled call: see package etcdsync) with an error matching
// both ctx's error and the last try's ErrLocked (or ErrNoPermits), or ctx's alone if no try
// found the lock busy; with ctx done already, having sent nothing. After Attempts(n) tries,
// the last one's error, wrapped. [ErrInvalidOption] before any try for a bad option, or a
// nil Locker as for [Once].
//
// Cost: each failed try costs what l's TryLock costs (one Txn for every etcdsync primitive)
// and writes nothing; the wake-up adds no RPC, since it uses the client's watch of the name
// (opened if no waiter of that client has it open).
func Retry(ctx context.Context, l Locker, opts ...RetryOption) error {
	cfg, err := retryOptions(opts)
	if err == nil && isNil(l) {
		err = fmt.Errorf("%w: nil Locker", ErrInvalidOption)
	}
	if err != nil {
		return fmt.Errorf("trylock: retry: %w", err)
	}
	return retry(ctx, l, cfg)
}

// Timeout is [Retry] with its default backoff and no limit on tries, for at most d. With
// d <= 0 it tries exactly once. The tries run on a context of Timeout's own, which ends when
// Timeout returns; what a try hands back to outlive it derives from ctx instead (the owning
// context of a reentrant.Mutex taken through [Reentrant] lives as long as the hold).
//
// Errors: when d passes with the lock still busy (for d <= 0, a busy lock), an error
// matching both [ErrTimeout] and the last try's [ErrLocked] (or [ErrNoPermits]); a try under
// way at d is cut short and leaves nothing behind. If ctx ends first, as Retry (ctx's error,
// not ErrTimeout). A nil Locker as for [Once].
//
// Cost: as Retry's. Over every etcdsync Locker, Timeout returns within d plus the bound of
// a cancelled call (see package etcdsync) whatever etcd does, also when it cannot be
// reached at all: a try under way at d is cancelled, and the release watch never blocks.
func Timeout(ctx context.Context, l Locker, d time.Duration) error {
	if isNil(l) {
		return fmt.Errorf("trylock: timeout: %w: nil Locker", ErrInvalidOption)
	}
	if d <= 0 {
		err := l.TryLock(ctx)
		if core.Busy(err) {
			return &gaveUpError{why: ErrTimeout, last: err, tries: 1}
		}
		return err
	}
	tctx, cancel := context.WithTimeoutCause(ctx, d, ErrTimeout)
	defer cancel()
	return retry(core.WithOutliving(tctx, ctx), l, defaultRetry())
}

// isNil reports whether v is nil or holds a nil pointer or func, whose methods a Locker's
// caller cannot expect to work.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func:
		return rv.IsNil()
	}
	return false
}

// gaveUpError is the error of a Retry or Timeout that ran out of time with the lock busy:
// it matches why (ctx's error, or ErrTimeout) and the last try's error.
type gaveUpError struct {
	why   error
	last  error
	tries int
}

func (e *gaveUpError) Error() string {
	return fmt.Sprintf("trylock: gave up after %d tries: %v; last try: %v", e.tries, e.why, e.last)
}

func (e *gaveUpError) Unwrap() []error { return []error{e.why, e.last} }

// retry runs the tries of Retry and Timeout.
func retry(ctx context.Context, l Locker, cfg retryConfig) error {
	if err := ctx.Err(); err != nil {
		return gaveUp(ctx, err, nil, 0) // before the release watch, so that nothing is sent
	}
	var arm func() <-chan struct{}
	if rw, ok := l.(ReleaseWatcher); ok {
		var stop func()
		arm, stop = rw.WatchRelease()
		defer stop()
	}
	delays := cfg.delays()
	var last error // the last busy try's error
	for try := 1; ; try++ {
		var released <-chan struct{}
		if arm != nil {
			released = arm() // before the try: a release between the try and the wait counts
		}
		err := l.TryLock(ctx)
		switch {
		case err == nil:
			return nil
		case !core.Busy(err) && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return gaveUp(ctx, err, last, try-1) // ctx ended during the try
		case !core.Busy(err):
			return fmt.Errorf("trylock: try %d: %w", try, err)
		}
		last = err
		if cfg.attempts > 0 && try >= cfg.attempts {
			return fmt.Errorf("trylock: gave up after %d tries: %w", try, err)
		}
		if err := pause(ctx, delays.Next(), released); err != nil {
			return gaveUp(ctx, err, last, try)
		}
	}
}

// gaveUp is the error of a retry whose ctx ended: ErrTimeout if that is its cause (Timeout),
// else ctx's error; joined with the last busy try's error, if any try found the lock busy.
func gaveUp(ctx context.Context, err, last error, tries int) error {
	why := ctx.Err()
	if errors.Is(context.Cause(ctx), ErrTimeout) {
		why = ErrTimeout
	}
	if last == nil {
		if why == ErrTimeout {
			return fmt.Errorf("trylock: %w before any try found the lock busy: %w", ErrTimeout, err)
		}
		return fmt.Errorf("trylock: %w", err)
	}
	return &gaveUpError{why: why, last: last, tries: tries}
}

// wakeFloor is the least time between two tries that a release cuts short, so that on a
// name with many releases each retry tries at most about 100 times a second.
const wakeFloor = 10 * time.Millisecond

// pause waits for d, or for a release on released but never less than min(d, wakeFloor),
// or until ctx ends (returning its error).
func pause(ctx context.Context, d time.Duration, released <-chan struct{}) error {
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return nil
		case <-released:
			released = nil
			rest := min(d, wakeFloor) - time.Since(start)
			if rest <= 0 {
				return nil
			}
			t.Reset(rest) // since Go 1.23, no stale tick of the old setting can come after
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
