package mutex

import (
	"context"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Do takes the lock as [Mutex.Lock] does, runs fn while it is held, and releases it once fn
// has returned: also when fn panics (the panic goes on after the release) and when ctx has
// ended meanwhile (the release has a context of its own: see [etcdsync]). fn's ctx derives
// from ctx and also ends as soon as the hold ends: lost, with the loss as its cause
// (context.Cause matches [ErrLost]), or unlocked ([ErrNotLocked]); stop the work then.
//
// Do releases only the hold it took: if fn unlocked it, Do's release does nothing and says
// [ErrNotLocked], also when another Lock of the handle holds by then.
//
// Errors: Lock's error, without calling fn. An error matching [ErrLost] if the hold was lost
// before it was released (joined with fn's error, if any): never nil when the hold was lost
// while fn ran. Otherwise fn's error joined with the release's. A nil fn is
// [ErrInvalidOption], and nothing is acquired.
//
// Cost: Lock's and Unlock's, and the watch that [Mutex.Done] starts.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return m.errorf("do", core.ErrNilFunc)
	}
	h, err := m.lock(ctx)
	if err != nil {
		return err
	}
	return core.Scoped(ctx, h, fn, func(ctx context.Context) error { return m.release(ctx, h) })
}
