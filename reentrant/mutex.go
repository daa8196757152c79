package reentrant

import (
	"context"
	"fmt"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Mutex is a distributed reentrant lock on one name, owned by contexts, safe for use by
// several goroutines, also when they share one owning context.
//
// Only [New] makes a usable Mutex. The zero Mutex and a nil *Mutex hold nothing and take
// nothing, and none of their methods blocks or panics: Lock and TryLock return
// [ErrInvalidOption] (and ctx), Unlock an error matching both ErrInvalidOption and
// [ErrNotLocked], and the others report no hold (Count 0, Token 0, Done closed, Err
// ErrNotLocked, IsOwner never true).
type Mutex struct {
	s core.Shell

	mu      sync.Mutex
	holders []*owner // owners on this handle whose hold is not released, oldest first
}

// New returns a Mutex on name over cli. It does no I/O. Errors, wrapped with the detail:
// [ErrInvalidName] for a bad name, [ErrInvalidOption] for a bad option or a nil cli.
func New(cli *clientv3.Client, name string, opts ...Option) (*Mutex, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("reentrant: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("reentrant %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("a reentrant mutex", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("reentrant %q: %w", name, err)
	}
	q, tel := core.NewQueue(cli, cfg, name), core.NewTelemetry(cfg, core.PrimitiveReentrant, name)
	return &Mutex{s: core.NewShell("reentrant", name, q, tel)}, nil
}

// unmade is the Shell of a Mutex that New did not make.
var unmade = core.Unmade("reentrant")

// shell is the Mutex's Shell, or unmade.
func (m *Mutex) shell() *core.Shell {
	if m == nil {
		return unmade
	}
	return m.s.Or(unmade)
}

// Lock takes the lock for the owner of ctx and returns the context that carries the hold;
// on failure it returns ctx unchanged with the error.
//
// If ctx owns a hold of m (it is, or derives from, a context that Lock or TryLock returned),
// Lock re-enters at once, counts up and returns ctx itself. During the last Unlock it waits
// for its outcome, and re-enters if the release failed. Otherwise ctx's owner is new: it
// waits in FIFO order with every other waiter on the name, also when another owner on this
// same handle holds the lock, and the context it returns, derived from ctx, is cancelled with
// a cause matching [ErrLost] as soon as the hold is lost.
//
// Within trylock.Timeout (on the context of its try, which ends when Timeout returns), the
// owning context derives from, and on re-entry Lock returns, the context given to Timeout: it
// lives as long as the hold.
//
// Errors on re-entry, without waiting: [ErrLost] if the hold was lost (also once the client
// is closed); ctx's error if it was released, or [ErrNotLocked] for a
// [context.WithoutCancel] copy that the release could not cancel; ctx's error if ctx is done.
// Errors of a new owner: ctx's error, wrapped, when ctx ends, having left no key (see
// [etcdsync] for how long that may take). [ErrInvalidOption]: m was not made by [New], or
// its client is closed.
//
// Cost: re-entry, no RPC. A new owner, one Txn uncontended (and one lease grant on the
// client's first use), and a watch of its key.
func (m *Mutex) Lock(ctx context.Context) (_ context.Context, err error) {
	if s := m.shell(); s == unmade {
		return ctx, s.Check("lock")
	}
	if o := m.ownerOf(ctx); o != nil {
		if err := o.enter(ctx); err != nil {
			return ctx, m.errorf("lock", err)
		}
		return core.Outliving(ctx), nil
	}
	// Only the outermost Lock is an acquisition; the owning context is made from ctx,
	// not from the span's.
	actx, a, err := m.shell().Begin(ctx, core.Wait, "lock", "etcdsync.reentrant.Lock")
	if err != nil {
		return ctx, err
	}
	defer func() { a.End(err) }()
	h, err := m.s.Q.Acquire(actx, m.spec(), nil)
	a.Held(h)
	if err != nil {
		return ctx, m.errorf("lock", err)
	}
	return m.own(ctx, h), nil
}

// TryLock is [Mutex.Lock] that never waits: with a context that owns a hold of m it
// re-enters as Lock does; otherwise it takes the lock only if nobody holds it or waits for
// it.
//
// Errors: [ErrLocked] otherwise, having written nothing. A done ctx, [ErrInvalidOption] and
// trylock.Timeout as for Lock.
//
// Cost: one Txn; none on re-entry.
func (m *Mutex) TryLock(ctx context.Context) (_ context.Context, err error) {
	if s := m.shell(); s == unmade {
		return ctx, s.Check("try lock")
	}
	if o := m.ownerOf(ctx); o != nil {
		if err := o.enter(ctx); err != nil {
			return ctx, m.errorf("try lock", err)
		}
		return core.Outliving(ctx), nil
	}
	actx, a, err := m.shell().Begin(ctx, core.Try, "try lock", "etcdsync.reentrant.TryLock")
	if err != nil {
		return ctx, err
	}
	defer func() { a.End(err) }()
	h, err := m.s.Q.TryAcquire(actx, core.LockSpec(ownerValue()))
	a.Held(h)
	if err != nil {
		return ctx, m.errorf("try lock", err)
	}
	return m.own(ctx, h), nil
}

// own makes a child of ctx (of the context given to trylock.Timeout, for one of its tries)
// the owner of h, with a count of 1, cancelled when h ends.
func (m *Mutex) own(ctx context.Context, h *core.Hold) context.Context {
	ctx = core.Outliving(ctx)
	octx, cancel := context.WithCancelCause(ctx)
	o := &owner{hold: h, count: 1}
	h.OnEnd(func(err error) { cancel(endCause(err)) })
	m.mu.Lock()
	m.holders = append(m.holders, o)
	m.mu.Unlock()
	return context.WithValue(octx, ownerKey{m}, o)
}

// Unlock counts one Lock of ctx's owner down; the last one releases the lock, with a delete
// fenced on the key's create revision (a late or repeated Unlock never frees a newer holder),
// and cancels the owning context (cause [context.Canceled]). An Unlock during another
// goroutine's last Unlock waits for its outcome, then returns [ErrNotLocked] if that released
// the hold, and otherwise counts down as if the other had not come.
//
// The last Unlock's delete does not stop when ctx ends, so that `defer m.Unlock(ctx)` frees
// the lock also when ctx's deadline passes (before or during the call), and with the owning
// context after a loss: it runs on a context detached from ctx that lasts 5 s past ctx's end
// (5 s from the call if ctx is done already; as long as it takes if ctx never ends). If etcd
// cannot be reached by then, the lock stays held with a count of 1 and Unlock may be called
// again.
//
// Errors: [ErrNotLocked] if ctx owns no hold of m (also once it was released). [ErrLost] if
// the hold was lost, or the client is closed: every Unlock then still counts down, and the
// last one ends the hold. On a Mutex not made by [New], an error matching
// [ErrInvalidOption] and ErrNotLocked.
//
// Cost: none but the last, which is one Txn.
func (m *Mutex) Unlock(ctx context.Context) error {
	if s := m.shell(); s == unmade {
		return s.Unheld("unlock")
	}
	o := m.ownerOf(ctx)
	if o == nil {
		return m.errorf("unlock", fmt.Errorf("%w: the context owns no hold of this Mutex", ErrNotLocked))
	}
	last, err := o.exit(ctx)
	if !last {
		if err != nil {
			return m.errorf("unlock", err)
		}
		return nil
	}
	rctx, a := m.shell().Start(ctx, core.Release, "etcdsync.reentrant.Unlock") // the last one only
	ended, err := o.release(rctx)
	if ended {
		m.forget(o)
	}
	o.released(ended)
	a.End(err)
	if err != nil {
		return m.errorf("unlock", err)
	}
	return nil
}

// Count is how many Locks the owner of ctx has made on m that no Unlock matched yet: 0 when
// ctx owns no hold of m, once the last Unlock released it, and on a Mutex not made by [New].
// After a loss it counts the Unlocks still due. No I/O.
func (m *Mutex) Count(ctx context.Context) int {
	if o := m.ownerOf(ctx); o != nil {
		return o.depth()
	}
	return 0
}

func (m *Mutex) ownerOf(ctx context.Context) *owner {
	o, _ := ctx.Value(ownerKey{m}).(*owner)
	return o
}

func (m *Mutex) forget(o *owner) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.holders = slices.DeleteFunc(m.holders, func(h *owner) bool { return h == o })
}

// current is the hold of the owner that holds the lock through m, or nil. A lost hold
// stays until its last Unlock, but a newer owner that holds since then comes first.
func (m *Mutex) current() *core.Hold {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.holders); n > 0 {
		return m.holders[n-1].hold
	}
	return nil
}

// Token is the fencing token of the hold that an owner has through m: its key's create
// revision, strictly increasing across the successive holders of the name; 0 without one.
// Like Done, Err, IsOwner and Key, it does no I/O.
func (m *Mutex) Token() int64 {
	return m.current().Token()
}

// Key is the etcd key of the hold that an owner has through m, "" without one. With Token
// and IsOwner it is what a fenced write outside Go needs (etcdsync's ETCDSYNC_KEY).
func (m *Mutex) Key() string {
	return m.current().Key()
}

// Done is closed when the hold that an owner has through m ends, by its last Unlock or by
// loss (then Err is [ErrLost]); without a hold it is a closed channel. The owning context
// tells the same, and is the one to pass to the work done under the lock.
func (m *Mutex) Done() <-chan struct{} {
	return m.current().Done()
}

// Err is nil while an owner holds the lock through m, [ErrLost] once its hold was lost until
// its last Unlock, and [ErrNotLocked] without a hold.
func (m *Mutex) Err() error {
	return m.current().Err()
}

// Asked is closed once the hold that an owner has through m is asked to let go (see Asking
// a holder to let go in package etcdsync); nil without a hold.
func (m *Mutex) Asked() <-chan struct{} {
	return m.current().Asked()
}

// IsOwner is a Txn compare that succeeds only while the hold that an owner has through m
// exists with its key's create revision: put it in the If of every write the lock guards.
// Without a hold it never succeeds.
func (m *Mutex) IsOwner() clientv3.Cmp {
	if m.shell() == unmade {
		return core.UnmadeOwner()
	}
	return m.s.Q.IsOwner(m.current())
}

func (m *Mutex) errorf(op string, err error) error { return m.shell().Errorf(op, err) }

// WatchRelease lets a caller that retries a failed TryLock wake when the lock may have come
// free instead of sleeping blindly; trylock's Retry and Timeout use it. Call arm before each
// TryLock: its channel yields once a key of the name is deleted after that (a last Unlock, a
// waiter giving up, a lost lease), or when the watch cannot tell whether one was, so a wake
// may be spurious. Call stop once done, from any goroutine; arm is for one goroutine at a
// time. On a Mutex not made by [New], arm's channel never yields.
//
// Cost: none of its own. It shares the client's one watch of the name with every waiter
// there (the first registration on a client opens it); neither it nor arm ever blocks.
func (m *Mutex) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if m.shell() == unmade {
		return core.NoReleases()
	}
	return m.s.Q.WatchRelease("")
}

// spec is the spec of a blocking acquisition by this handle, counted in its telemetry.
func (m *Mutex) spec() core.Spec {
	spec := core.LockSpec(ownerValue())
	spec.Tel = m.s.Tel
	return spec
}
