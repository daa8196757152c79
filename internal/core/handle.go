package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Turn is the one turn of the calls of a handle that must not overlap (a Lock and the next,
// two Unlocks, two Campaigns). The zero Turn is free. It is handed over in order: Give
// passes it straight to the caller that has waited longest, so a caller that gives it back
// and asks again at once (a Run's next term) queues behind those already waiting, as a
// goroutine blocked on a full channel of one does. It costs a few words until someone
// waits for it (three words: a process may keep a handle per name for thousands of names).
type Turn struct {
	mu      sync.Mutex
	taken   bool
	waiters *[]chan struct{} // oldest first; closed when handed the turn. nil until one waits
}

// Take takes the turn: at once if it is free, also with ctx done, so that a done ctx still
// gets what needs no I/O; otherwise once it is handed over, or ctx's error.
func (t *Turn) Take(ctx context.Context) error {
	_, err := t.TakeOr(ctx, nil, nil)
	return err
}

// TakeOr is Take that also stops waiting when a or b closes (nil: never), for a caller that
// waits for the turn and for something else at once: taken reports whether it has the turn
// (handed over as a or b closed, it has).
func (t *Turn) TakeOr(ctx context.Context, a, b <-chan struct{}) (taken bool, err error) {
	t.mu.Lock()
	if !t.taken {
		t.taken = true
		t.mu.Unlock()
		return true, nil
	}
	w := make(chan struct{})
	if t.waiters == nil {
		t.waiters = new([]chan struct{})
	}
	*t.waiters = append(*t.waiters, w)
	t.mu.Unlock()
	select {
	case <-w:
		return true, nil
	case <-a:
	case <-b:
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-w: // handed over meanwhile
		if err == nil {
			return true, nil
		}
		t.giveLocked() // ctx ended: on to the next
		return false, err
	default:
	}
	*t.waiters = slices.DeleteFunc(*t.waiters, func(x chan struct{}) bool { return x == w })
	return false, err
}

// TryTake takes the turn if it is free, and reports whether it did.
func (t *Turn) TryTake() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.taken {
		return false
	}
	t.taken = true
	return true
}

// Give gives the turn back: to the caller that has waited longest, or free.
func (t *Turn) Give() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.giveLocked()
}

func (t *Turn) giveLocked() {
	if t.waiters == nil || len(*t.waiters) == 0 {
		t.taken, t.waiters = false, nil
		return
	}
	w := *t.waiters
	close(w[0])
	*t.waiters = w[1:]
}

// ErrNilFunc is the detail of the ErrInvalidOption a Do returns for a nil fn.
var ErrNilFunc = fmt.Errorf("%w: fn is nil", ErrInvalidOption)

// ErrReleasedEarly is the cause of fn's ctx when its hold was released before fn returned,
// by fn or by another call on the handle: it matches ErrNotLocked.
var ErrReleasedEarly = fmt.Errorf("%w: the hold was released before fn returned", ErrNotLocked)

// Scoper is a hold that work can be scoped to: a Hold, or a Group of several names.
type Scoper interface {
	OnEnd(f func(error))
	Err() error
	Asked() <-chan struct{}
	client() *clientv3.Client
	heeds() *asking // what asks it to let go, when its queue heeds asks (WithYieldOnAsk); else nil
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
// With WithYieldOnAsk, fn's ctx also ends when the hold is asked to let go (Asked), with
// an AskedError as its cause; an error of fn's is then joined with it.
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
	if a := h.heeds(); a != nil {
		go func() {
			select {
			case <-a.ch:
				cancel(a.err)
			case <-fctx.Done():
			}
		}()
	}
	returned := false
	defer func() {
		if !returned { // fn panicked or called runtime.Goexit: release all the same
			_ = releaseScoped(ctx, h, release)
		}
	}()
	ferr := fn(fctx)
	returned = true
	if cause := context.Cause(fctx); ferr != nil && !errors.Is(ferr, ErrAsked) && errors.Is(cause, ErrAsked) {
		ferr = errors.Join(ferr, cause)
	}
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
	return err == nil || errors.Is(err, ErrLost) || errors.Is(err, ErrNotLocked) || Refused(err)
}

func (scopedRelease) drop() {} // the client is closed: the key goes with its lease

// Unusable says why q cannot serve a call: ErrInvalidOption for no queue (nil: the handle
// was not made by New) or a closed client; nil when it can. No I/O.
func (q *Queue) Unusable() error {
	if q == nil {
		return errUnmade
	}
	return clientUnusable(q.cli)
}

// unmadeKey is the key that UnmadeOwner compares: no name's key, since every name's keys
// end in "/" + a kind or a lease.
const unmadeKey = "etcdsync: no handle"

// UnmadeOwner is the IsOwner of a handle not made by New: a compare that never succeeds.
// Having no name, it compares a key outside every name; under a prefix grant etcd refuses
// it, which fails the Txn just the same.
func UnmadeOwner() clientv3.Cmp { return NeverOwner(unmadeKey) }

// EndIfClientClosed ends the hold as lost if its client is closed: nothing can release it
// through that client now, and its key goes with its lease, which nobody renews. It returns
// the loss, after which Release returns it at once; nil while the client is open.
func (h *Hold) EndIfClientClosed() error {
	if h == nil || h.cli.Ctx().Err() == nil {
		return nil
	}
	loss := fmt.Errorf("%w: %w", ErrLost, errClientClosed)
	h.Lose(loss)
	return loss
}

// Unheld is err, why a handle is unusable, for a call that needs a hold (a release): it
// matches ErrNotLocked too, that call's answer without a hold.
func Unheld(err error) error { return fmt.Errorf("%w (%w)", err, ErrNotLocked) }

// NoReleases is the WatchRelease of a handle not made by New: arm's channel never yields.
func NoReleases() (arm func() <-chan struct{}, stop func()) {
	return func() <-chan struct{} { return nil }, func() {}
}

// A Shell is what every primitive's handle is built on: its queue and its telemetry, and
// what each of its calls does with them first (Begin): refuse a handle that New did not
// make, or whose client is closed; name the handle and the call in every error (Errorf);
// start the call's span and, for an acquisition, its measurements. A handle keeps its
// Shell by value and gives its calls a pointer to it, or to an Unmade one when New did not
// make it (a zero or nil handle), so that no call needs a check of its own.
type Shell struct {
	Q   *Queue
	Tel *Telemetry
	// Its errors begin with the kind and the name, quoted (`mutex "nightly"`), or the kind
	// alone without a name (unmade, or a kind that names its names: "mutex multi [...]").
	// Neither is built per handle: a process may keep thousands (TestCostPerHold).
	kind, name string
}

// NewShell is the Shell of a handle of kind (the package: "mutex") on name.
func NewShell(kind, name string, q *Queue, tel *Telemetry) Shell {
	return Shell{Q: q, Tel: tel, kind: kind, name: name}
}

// Unmade is the Shell of a handle of kind that New did not make.
func Unmade(kind string) *Shell { return &Shell{kind: kind} }

// Or is s, or unmade if s is nil or was not made by NewShell (a zero handle's).
func (s *Shell) Or(unmade *Shell) *Shell {
	if s == nil || s.Q == nil {
		return unmade
	}
	return s
}

// Errorf is err as the error of the handle's call op.
func (s *Shell) Errorf(op string, err error) error {
	if s.name == "" {
		return fmt.Errorf("%s: %s: %w", s.kind, op, err)
	}
	return fmt.Errorf("%s %q: %s: %w", s.kind, s.name, op, err)
}

// Check is why the handle cannot serve the call op (ErrInvalidOption: New did not make it,
// or its client is closed), as its error; nil when it can. No I/O.
func (s *Shell) Check(op string) error {
	if err := s.Q.Unusable(); err != nil {
		return s.Errorf(op, err)
	}
	return nil
}

// Unheld is the error of the release op of a handle that New did not make, which matches
// ErrInvalidOption and ErrNotLocked (the answer without a hold).
func (s *Shell) Unheld(op string) error { return s.UnheldAs(op, ErrNotLocked) }

// UnheldAs is Unheld for a handle whose answer without a hold is none (an election's
// ErrNotLeader, a barrier's ErrNotEntered): why it cannot serve op, matching none too.
func (s *Shell) UnheldAs(op string, none error) error {
	return s.Errorf(op, fmt.Errorf("%w (%w)", s.Q.Unusable(), none))
}

// A Call is what a call of a handle does, for its telemetry: wait for a hold, try for one,
// or release one.
type Call uint8

const (
	Wait Call = iota
	Try
	Release
)

// Begin starts the acquisition op (Wait or Try), traced as span: Check's error, or Start's
// context and Attempt.
func (s *Shell) Begin(ctx context.Context, c Call, op, span string) (context.Context, Attempt, error) {
	if err := s.Check(op); err != nil {
		return ctx, Attempt{}, err
	}
	ctx, a := s.Start(ctx, c, span)
	return ctx, a, nil
}

// Start starts the call, traced as span, without Check (a release is never refused:
// through a closed client its hold ends as lost, see Hold.EndIfClientClosed): ctx with the
// span, and the Attempt that the call ends (End) and, for an acquisition, tells what it
// took (Held).
func (s *Shell) Start(ctx context.Context, c Call, span string) (context.Context, Attempt) {
	switch c {
	case Wait:
		return s.Tel.BeginWait(ctx, span)
	case Try:
		return s.Tel.BeginTry(ctx, span)
	}
	return s.Tel.BeginRelease(ctx, span)
}
