package reentrant

import (
	"context"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Do takes the lock as [Mutex.Lock] does, runs fn while it is held, and releases it once fn
// has returned: also when fn panics (the panic goes on after the release) and when ctx has
// ended meanwhile (the release has a context of its own: see [etcdsync]). fn's ctx owns the
// lock, so a Lock or a Do inside fn with it re-enters; it also ends as soon as the hold is
// lost, with the loss as its cause (context.Cause matches [ErrLost]). Called with a ctx
// that owns the lock already, Do re-enters and its release only counts down. Do releases
// only its own owner's hold: once fn's Unlocks have released it, Do's release says
// [ErrNotLocked] and leaves any later owner's hold alone.
//
// Errors: Lock's error, without calling fn. An error matching [ErrLost] if the hold was lost
// before it was released (joined with fn's error, if any): never nil when the hold was lost
// while fn ran. Otherwise fn's error joined with the release's. A nil fn is
// [ErrInvalidOption], and nothing is acquired.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return m.errorf("do", core.ErrNilFunc)
	}
	owner, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	return core.Scoped(owner, m.ownerOf(owner).hold, fn, m.Unlock)
}
