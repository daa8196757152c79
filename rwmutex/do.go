package rwmutex

import (
	"context"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Do takes the write lock as [RWMutex.Lock] does, runs fn while it is held, and releases it
// once fn has returned: also when fn panics (the panic goes on after the release) and when
// ctx has ended meanwhile (the release then has up to 5 s of its own). fn's ctx derives from
// ctx and also ends as soon as the hold is lost, with the loss as its cause (context.Cause
// matches [ErrLost]).
//
// Errors: Lock's error, without calling fn. An error matching [ErrLost] if the hold was lost
// before it was released (joined with fn's error, if any): never nil when the hold was lost
// while fn ran. Otherwise fn's error joined with [RWMutex.Unlock]'s. A nil fn is
// [ErrInvalidOption], and nothing is acquired.
func (rw *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return rw.errorf("do", core.ErrNilFunc)
	}
	if err := rw.Lock(ctx); err != nil {
		return err
	}
	return core.Scoped(ctx, rw.current(), fn, rw.Unlock)
}

// RDo is [RWMutex.Do] for the read lock: it takes it as [RWMutex.RLock] does, runs fn while it
// is held and releases it with [RWMutex.RUnlock]. fn's ctx ends when the read hold is lost,
// which for the readers of one handle is one hold (see [RWMutex]).
func (rw *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return rw.errorf("rdo", core.ErrNilFunc)
	}
	if err := rw.RLock(ctx); err != nil {
		return err
	}
	return core.Scoped(ctx, rw.current(), fn, rw.RUnlock)
}
