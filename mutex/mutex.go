package mutex

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Mutex is a distributed lock on one name. It is safe for use by several goroutines: like
// sync.Mutex, a Lock on a handle that holds the lock waits for its Unlock, and it never
// re-enters (see package reentrant for that).
//
// Only New makes a usable Mutex. The zero Mutex and a nil *Mutex hold nothing and take
// nothing: Lock and TryLock return ErrInvalidOption, Unlock an error matching both
// ErrInvalidOption and ErrNotLocked, and the others report no hold (Token 0, Done closed,
// Err ErrNotLocked, IsOwner never true, Key ""). None of them blocks or panics.
type Mutex struct {
	name      string
	q         *core.Queue
	turn      chan struct{} // the handle's own one-at-a-time: full while it waits or holds
	unlocking chan struct{} // one Unlock at a time: full while one runs
	tel       *core.Telemetry

	mu      sync.Mutex
	hold    *core.Hold
	waiting string // key of the acquisition under way
}

// New returns a Mutex on name over cli. It does no I/O. A bad name returns ErrInvalidName,
// a bad option or a nil client ErrInvalidOption, both wrapped with the detail.
func New(cli *clientv3.Client, name string, opts ...Option) (*Mutex, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("mutex: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("mutex %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.Options(opts)
	if err != nil {
		return nil, fmt.Errorf("mutex %q: %w", name, err)
	}
	return &Mutex{
		name:      name,
		q:         core.NewQueue(cli, core.SessionsFor(cli, cfg), cfg.KeyPrefix(name)),
		turn:      make(chan struct{}, 1),
		unlocking: make(chan struct{}, 1),
		tel:       core.NewTelemetry(cfg, core.PrimitiveMutex, name),
	}, nil
}

// queue is the Mutex's queue; nil for a Mutex that New did not make.
func (m *Mutex) queue() *core.Queue {
	if m == nil {
		return nil
	}
	return m.q
}

// Lock waits until the lock is held, in FIFO order with every other waiter on the name.
// Uncontended it costs one Txn (and one lease grant on the client's first use). With ctx
// done already it returns ctx's error, wrapped, having sent nothing. If ctx ends while it
// waits, it returns ctx's error after deleting its key; if ctx ends while the Txn that
// writes the key is in flight, Lock waits up to a second more for its answer, since etcd
// may apply it after the delete otherwise, and up to a second for the delete; a delete that
// etcd does not answer by then is done in the background. ErrLost means the session's
// lease expired while waiting; the next Lock takes a new one. ErrInvalidOption: m was not
// made by New, or its client is closed.
//
// Like a sync.Mutex, a handle stays taken from Lock to Unlock, also when its hold was lost
// in between: call Unlock (it returns ErrLost) before this handle can Lock again.
func (m *Mutex) Lock(ctx context.Context) (err error) {
	if err := m.queue().Unusable(); err != nil {
		return m.errorf("lock", err)
	}
	ctx, a := m.tel.BeginWait(ctx, "etcdsync.mutex.Lock")
	defer func() { a.End(err) }()
	select {
	case m.turn <- struct{}{}:
	case <-ctx.Done():
		return m.errorf("lock", ctx.Err())
	}
	h, err := m.q.Acquire(ctx, core.Spec{Slots: 1, Value: core.OwnerValue(""), Tel: m.tel}, m.setWaiting)
	a.Held(h)
	m.mu.Lock()
	m.waiting, m.hold = "", h
	m.mu.Unlock()
	if err != nil {
		<-m.turn
		return m.errorf("lock", err)
	}
	return nil
}

// TryLock takes the lock only if nobody holds it or waits for it; otherwise, or if this
// handle holds or waits already, it returns ErrLocked having written nothing. One Txn.
// With ctx done already it returns ctx's error having sent nothing; if ctx ends while its
// Txn is in flight, it returns within about 2 s (see Lock). ErrInvalidOption as for Lock.
func (m *Mutex) TryLock(ctx context.Context) (err error) {
	if err := m.queue().Unusable(); err != nil {
		return m.errorf("try lock", err)
	}
	ctx, a := m.tel.BeginTry(ctx, "etcdsync.mutex.TryLock")
	defer func() { a.End(err) }()
	select {
	case m.turn <- struct{}{}:
	default:
		return m.errorf("try lock", ErrLocked)
	}
	h, err := m.q.TryAcquire(ctx, core.Spec{Slots: 1, Value: core.OwnerValue("")})
	a.Held(h)
	if err != nil {
		<-m.turn
		return m.errorf("try lock", err)
	}
	m.mu.Lock()
	m.hold = h
	m.mu.Unlock()
	return nil
}

// Unlock releases the lock: one Txn that deletes the key only while its create revision is
// still this hold's, so a late or repeated Unlock never frees a newer holder. It returns
// ErrNotLocked without a hold, and ErrLost (the hold has ended all the same) if the hold
// was lost before, or if the client is closed: the key then goes with its lease. If etcd
// cannot be reached before ctx ends, or ctx is done already (Unlock then sends nothing),
// the lock stays held and Unlock may be called again: give it a ctx that outlives the work
// it guards, such as context.Background(). An Unlock that comes while another one runs
// waits for its outcome, then returns ErrNotLocked if it released the lock, and otherwise
// tries itself. On a Mutex not made by New it returns an error matching ErrInvalidOption
// and ErrNotLocked.
func (m *Mutex) Unlock(ctx context.Context) (err error) {
	if m.queue() == nil {
		return m.errorf("unlock", core.Unheld(m.queue().Unusable()))
	}
	ctx, a := m.tel.BeginRelease(ctx, "etcdsync.mutex.Unlock")
	defer func() { a.End(err) }()
	h := m.current()
	if h == nil {
		return m.errorf("unlock", ErrNotLocked)
	}
	if err := core.TakeTurn(ctx, m.unlocking); err != nil {
		return m.errorf("unlock", err)
	}
	defer func() { <-m.unlocking }()
	if m.current() != h {
		return m.errorf("unlock", ErrNotLocked) // the Unlock before this one released it
	}
	_ = h.EndIfClientClosed()
	ended, err := h.Release(ctx)
	if ended {
		m.mu.Lock()
		m.hold = nil
		m.mu.Unlock()
		<-m.turn
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

// Token is the fencing token of the hold: its key's create revision, strictly increasing
// across the successive holders of the name. 0 without a hold. No I/O, as for Done, Err,
// IsOwner and Key.
func (m *Mutex) Token() int64 {
	return m.current().Token()
}

// Done is closed when the current hold ends: by Unlock, or by loss (then Err is ErrLost).
// Without a hold it is an already closed channel.
//
// The first call to Done or Err on a hold starts a watch of its key and session (from the
// key's creation on, so a loss that came before is reported at once); a hold that is never
// asked costs no watch. Either way Unlock reports a loss, and IsOwner fences writes.
func (m *Mutex) Done() <-chan struct{} {
	return m.current().Done()
}

// Err is nil while the lock is held, ErrLost once the hold was lost (its key deleted, its
// lease expired or revoked) until Unlock, and ErrNotLocked without a hold. See Done for
// when a loss becomes known.
func (m *Mutex) Err() error {
	return m.current().Err()
}

// IsOwner is a Txn compare that succeeds only while this hold's key exists with its
// create revision: put it in the If of every write the lock guards. Without a hold it
// never succeeds.
func (m *Mutex) IsOwner() clientv3.Cmp {
	if m.queue() == nil {
		return core.UnmadeOwner()
	}
	return m.q.IsOwner(m.current())
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

func (m *Mutex) errorf(op string, err error) error {
	if m.queue() == nil {
		return fmt.Errorf("mutex: %s: %w", op, err)
	}
	return fmt.Errorf("mutex %q: %s: %w", m.name, op, err)
}
