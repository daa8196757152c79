package mutex

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Mutex is a distributed lock on one name, safe for use by several goroutines. Like
// [sync.Mutex], a Lock on a handle that holds the lock waits for its Unlock; it never
// re-enters (that is package reentrant).
//
// Only [New] makes a usable Mutex. The zero Mutex and a nil *Mutex hold nothing and take
// nothing, and none of their methods blocks or panics: Lock and TryLock return
// [ErrInvalidOption], Unlock an error matching both ErrInvalidOption and [ErrNotLocked], and
// the others report no hold (Token 0, Done closed, Err ErrNotLocked, IsOwner never true,
// Key "").
type Mutex struct {
	s         core.Shell
	turn      core.Turn // the handle's own one-at-a-time: taken while it waits or holds
	unlocking core.Turn // one Unlock at a time: taken while one runs

	mu      sync.Mutex
	hold    *core.Hold
	waiting string // key of the acquisition under way
}

// New returns a Mutex on name over cli. It does no I/O. Errors, wrapped with the detail:
// [ErrInvalidName] for a bad name, [ErrInvalidOption] for a bad option or a nil cli.
func New(cli *clientv3.Client, name string, opts ...Option) (*Mutex, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("mutex: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("mutex %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("a mutex", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("mutex %q: %w", name, err)
	}
	q, tel := core.NewQueue(cli, cfg, name), core.NewTelemetry(cfg, core.PrimitiveMutex, name)
	return &Mutex{s: core.NewShell("mutex", name, q, tel)}, nil
}

// unmade is the Shell of a Mutex that New did not make.
var unmade = core.Unmade("mutex")

// shell is the Mutex's Shell, or unmade.
func (m *Mutex) shell() *core.Shell {
	if m == nil {
		return unmade
	}
	return m.s.Or(unmade)
}

// Lock waits until m holds the lock, in FIFO order with every other waiter on the name. The
// handle stays taken until [Mutex.Unlock], also once its hold is lost: Unlock (which then
// returns [ErrLost]) before m can Lock again.
//
// Errors: ctx's error, wrapped, when ctx ends, having left no key (see [etcdsync] for how
// long that may take). [ErrLost]: the session's lease expired while waiting; the next Lock
// takes a new one. [ErrInvalidOption]: m was not made by [New], or its client is closed.
//
// Cost: one Txn uncontended, and one lease grant on the client's first use.
func (m *Mutex) Lock(ctx context.Context) error {
	_, err := m.lock(ctx)
	return err
}

// lock is Lock, returning the hold it took.
func (m *Mutex) lock(ctx context.Context) (_ *core.Hold, err error) {
	ctx, a, err := m.shell().Begin(ctx, core.Wait, "lock", "etcdsync.mutex.Lock")
	if err != nil {
		return nil, err
	}
	defer func() { a.End(err) }()
	if err := m.turn.Take(ctx); err != nil {
		return nil, m.errorf("lock", err)
	}
	h, err := m.s.Q.Acquire(ctx, m.spec(), m.setWaiting)
	a.Held(h)
	m.mu.Lock()
	m.waiting, m.hold = "", h
	m.mu.Unlock()
	if err != nil {
		m.turn.Give()
		return nil, m.errorf("lock", err)
	}
	return h, nil
}

// TryLock takes the lock only if nobody holds it or waits for it, and m neither holds nor
// waits.
//
// Errors: [ErrLocked] otherwise, having written nothing. ctx's error and [ErrInvalidOption]
// as for [Mutex.Lock].
//
// Cost: one Txn.
func (m *Mutex) TryLock(ctx context.Context) (err error) {
	ctx, a, err := m.shell().Begin(ctx, core.Try, "try lock", "etcdsync.mutex.TryLock")
	if err != nil {
		return err
	}
	defer func() { a.End(err) }()
	if !m.turn.TryTake() {
		return m.errorf("try lock", ErrLocked)
	}
	h, err := m.s.Q.TryAcquire(ctx, core.LockSpec(core.OwnerValue("")))
	a.Held(h)
	if err != nil {
		m.turn.Give()
		return m.errorf("try lock", err)
	}
	m.mu.Lock()
	m.hold = h
	m.mu.Unlock()
	return nil
}

// Unlock releases the lock, with a delete fenced on the key's create revision: a late or
// repeated Unlock never frees a newer holder. If etcd cannot be reached before ctx ends, or
// ctx is done already (then nothing is sent), the lock stays held and Unlock may be called
// again. An Unlock during another one waits for its outcome, then returns [ErrNotLocked] if
// that released the lock, and otherwise tries itself.
//
// Errors: [ErrNotLocked] without a hold. [ErrLost] if the hold was lost before, or the client
// is closed; the hold has ended all the same (the key goes with its lease). On a Mutex not
// made by [New], an error matching [ErrInvalidOption] and ErrNotLocked.
//
// Cost: one Txn.
func (m *Mutex) Unlock(ctx context.Context) error {
	if s := m.shell(); s == unmade {
		return s.Unheld("unlock")
	}
	return m.release(ctx, m.current())
}

// release releases h if it is still the handle's hold; ErrNotLocked if it is not (nil, or
// released already), so that Do never frees a later hold of the handle.
func (m *Mutex) release(ctx context.Context, h *core.Hold) (err error) {
	ctx, a := m.shell().Start(ctx, core.Release, "etcdsync.mutex.Unlock")
	defer func() { a.End(err) }()
	if h == nil {
		return m.errorf("unlock", ErrNotLocked)
	}
	if err := m.unlocking.Take(ctx); err != nil {
		return m.errorf("unlock", err)
	}
	defer m.unlocking.Give()
	if m.current() != h {
		return m.errorf("unlock", ErrNotLocked) // released before: by an Unlock, or fn in Do
	}
	_ = h.EndIfClientClosed()
	ended, err := h.Release(ctx)
	if ended {
		m.mu.Lock()
		m.hold = nil
		m.mu.Unlock()
		m.turn.Give()
	}
	if err != nil {
		return m.errorf("unlock", err)
	}
	return nil
}

func (m *Mutex) current() *core.Hold {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hold
}

func (m *Mutex) setWaiting(key string) {
	m.mu.Lock()
	m.waiting = key
	m.mu.Unlock()
}

// Token is the hold's fencing token: its key's create revision, strictly increasing across
// the successive holders of the name; 0 without a hold. Like Done, Err, IsOwner and Key, it
// does no I/O.
func (m *Mutex) Token() int64 {
	return m.current().Token()
}

// Done is closed when the current hold ends, by [Mutex.Unlock] or by loss (then Err is
// [ErrLost]); without a hold it is a closed channel.
//
// Cost: the first call to Done or Err on a hold starts a watch of its key and session, from
// the key's creation on (so a loss that came before is reported at once); a hold never asked
// costs no watch, and Unlock still reports a loss and IsOwner still fences.
func (m *Mutex) Done() <-chan struct{} {
	return m.current().Done()
}

// Err is nil while the lock is held, [ErrLost] once the hold was lost (its key deleted, its
// lease expired or revoked) until Unlock, and [ErrNotLocked] without a hold. See
// [Mutex.Done] for when a loss becomes known.
func (m *Mutex) Err() error {
	return m.current().Err()
}

// Asked is closed once this hold is asked to let go (see Asking a holder to let go in
// package etcdsync); nil without a hold.
func (m *Mutex) Asked() <-chan struct{} {
	return m.current().Asked()
}

// IsOwner is a Txn compare that succeeds only while this hold's key exists with its create
// revision: put it in the If of every write the lock guards. Without a hold it never
// succeeds.
func (m *Mutex) IsOwner() clientv3.Cmp {
	if m.shell() == unmade {
		return core.UnmadeOwner()
	}
	return m.s.Q.IsOwner(m.current())
}

// Key is this handle's key in etcd while it holds the lock or waits for it, else "".
func (m *Mutex) Key() string {
	if m == nil {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hold != nil {
		return m.hold.Key()
	}
	return m.waiting
}

func (m *Mutex) errorf(op string, err error) error { return m.shell().Errorf(op, err) }

// WatchRelease lets a caller that retries a failed TryLock wake when the lock may have come
// free instead of sleeping blindly; trylock's Retry and Timeout use it. Call arm before each
// TryLock: its channel yields once a key of the name is deleted after that (an Unlock, a
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
	spec := core.LockSpec(core.OwnerValue(""))
	spec.Tel = m.s.Tel
	return spec
}
