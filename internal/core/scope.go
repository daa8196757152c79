package core

import (
	"context"
	"errors"
	"fmt"
)

// ErrNilFunc is the detail of the ErrInvalidOption a Do returns for a nil fn.
var ErrNilFunc = fmt.Errorf("%w: fn is nil", ErrInvalidOption)

// Scoped runs fn while h is held, and then releases it with release: the body of every Do.
// fn's ctx derives from ctx and also ends when the hold is lost, with the loss (an ErrLost)
// as its cause; watching for that starts the hold's watch. The release happens once fn has
// returned, on a context that outlives ctx by up to 5 s (Detached), also when fn panics or
// calls runtime.Goexit: the panic then goes on after the release.
//
// It returns an error matching ErrLost if the hold was lost before the release ended it
// (joined with fn's error, if any), else fn's error joined with the release's: never nil
// when the hold was lost while fn ran.
func Scoped(ctx context.Context, h *Hold, fn func(context.Context) error, release func(context.Context) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	h.OnEnd(func(end error) {
		if end != nil {
			cancel(end)
		}
	})
	returned := false
	defer func() {
		if !returned { // fn panicked or called runtime.Goexit: release all the same
			rctx, rcancel := Detached(ctx)
			_ = release(rctx)
			rcancel()
		}
	}()
	ferr := fn(fctx)
	returned = true
	lost := h.Err() // ErrLost once lost; nil while held
	rctx, rcancel := Detached(ctx)
	rerr := release(rctx)
	rcancel()
	switch {
	case lost != nil && errors.Is(lost, ErrLost):
		return errors.Join(lost, ferr)
	case errors.Is(rerr, ErrLost):
		return errors.Join(rerr, ferr)
	}
	return errors.Join(ferr, rerr)
}
