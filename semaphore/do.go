package semaphore

import (
	"context"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Do takes a permit of n units as [Semaphore.AcquireN] does, runs fn while it is held, and
// releases it once fn has returned: also when fn panics (the panic goes on after the
// release) and when ctx has ended meanwhile (the release has a context of its own: see
// [etcdsync]). fn's ctx derives from ctx and also ends as soon as the permit is lost, with
// the loss as its cause (context.Cause matches [ErrLost]), or once fn releases it;
// [Semaphore.PermitOf] of it is the permit, for fenced writes. Do releases that permit
// only: if fn released it, Do's release says [ErrNotLocked].
//
// Errors: AcquireN's error (n out of range is [ErrInvalidOption]), without calling fn. An
// error matching [ErrLost] if the permit was lost before it was released (joined with fn's
// error, if any): never nil when it was lost while fn ran. Otherwise fn's error joined with
// [Permit.Release]'s. A nil fn is [ErrInvalidOption], and nothing is acquired.
func (s *Semaphore) Do(ctx context.Context, n int, fn func(ctx context.Context) error) error {
	if fn == nil {
		return s.errorf("do", core.ErrNilFunc)
	}
	p, err := s.AcquireN(ctx, n)
	if err != nil {
		return err
	}
	return core.Scoped(context.WithValue(ctx, permitKey{s}, p), p.hold(), fn, p.Release)
}

// permitKey is the context key of the permit that s's Do holds.
type permitKey struct{ s *Semaphore }

// PermitOf is the permit that [Semaphore.Do] holds for fn, given fn's ctx (or one derived
// from it): its IsOwner and Token fence the writes fn makes. nil for any other ctx.
func (s *Semaphore) PermitOf(ctx context.Context) *Permit {
	p, _ := ctx.Value(permitKey{s}).(*Permit)
	return p
}
