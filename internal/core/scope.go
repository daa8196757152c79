package core

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNilFunc is the detail of the ErrInvalidOption a Do returns for a nil fn.
var ErrNilFunc = fmt.Errorf("%w: fn is nil", ErrInvalidOption)

// ErrReleasedEarly is the cause of fn's ctx when its hold was released before fn returned,
// by fn or by another call on the handle: it matches ErrNotLocked.
var ErrReleasedEarly = fmt.Errorf("%w: the hold was released before fn returned", ErrNotLocked)

// Scoper is a hold that work can be scoped to: a Hold, or a Group of several names.
type Scoper interface {
	OnEnd(f func(error))
	Err() error
	client() *clientv3.Client
}

func (h *Hold) client() *clientv3.Client { return h.cli }

// Scoped runs fn while h is held, and then releases it with release: the body of every Do.
// release must release h and no other hold of the handle (a later hold, after fn released h
// and the handle was locked again), and say ErrNotLocked when h has ended already.
// fn's ctx derives from ctx and also ends when the hold ends: lost, with the loss (an
// ErrLost) as its cause, or released before fn returned (ErrReleasedEarly); watching for that
// starts the hold's watch. The release happens once fn has
// returned, on a context that outlives ctx by up to 5 s (Detached), also when fn panics or
// calls runtime.Goexit: the panic then goes on after the release.
//
// A release that does not get through by then is handed to the client's janitor, which
// calls release again until etcd answers: the hold's owner has let it go, and nobody else
// would release it (its key would sit on a lease the shared session keeps renewing).
//
// It returns an error matching ErrLost if the hold was lost before the release ended it
// (joined with fn's error, if any), else fn's error joined with the release's: never nil
// when the hold was lost while fn ran.
func Scoped(ctx context.Context, h Scoper, fn func(context.Context) error, release func(context.Context) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	h.OnEnd(func(end error) {
		if end == nil {
			end = ErrReleasedEarly // after fn returned, by release itself: cancel is moot then
		}
		cancel(end)
	})
	returned := false
	defer func() {
		if !returned { // fn panicked or called runtime.Goexit: release all the same
			_ = releaseScoped(ctx, h, release)
		}
	}()
	ferr := fn(fctx)
	returned = true
	lost := h.Err() // ErrLost once lost; nil while held
	rerr := releaseScoped(ctx, h, release)
	switch {
	case lost != nil && errors.Is(lost, ErrLost):
		return errors.Join(lost, ferr)
	case errors.Is(rerr, ErrLost):
		return errors.Join(rerr, ferr)
	}
	return errors.Join(ferr, rerr)
}

// releaseScoped releases h with release on a context that outlives ctx by up to 5 s; if that
// does not settle it (released, lost, or not held), the janitor goes on with it.
func releaseScoped(ctx context.Context, h Scoper, release func(context.Context) error) error {
	rctx, cancel := Detached(ctx)
	err := release(rctx)
	cancel()
	if c := (scopedRelease{base: ctx, release: release}); !c.settled(err) {
		janitorOf(h.client()).add(c)
		return fmt.Errorf("%w (the release goes on in the background until etcd answers)", err)
	}
	return err
}

// scopedRelease is the chore of releasing a hold whose Do returned before its release got
// through: the handle's own release, so that the handle is free again afterwards, on a
// context with base's values (a reentrant owner) and the janitor's deadline.
type scopedRelease struct {
	base    context.Context
	release func(context.Context) error
}

func (c scopedRelease) attempt(ctx context.Context) bool {
	rctx, cancel := context.WithCancel(context.WithoutCancel(c.base))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	return c.settled(c.release(rctx))
}

// settled reports whether a release that returned err needs no other try.
func (scopedRelease) settled(err error) bool {
	return err == nil || errors.Is(err, ErrLost) || errors.Is(err, ErrNotLocked) || refused(err)
}

func (scopedRelease) drop() {} // the client is closed: the key goes with its lease
