package reentrant

import (
	"context"
	"fmt"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Mutex is a distributed reentrant lock on one name, owned by contexts. It is safe for use
// by several goroutines, also when they share one owning context.
type Mutex struct {
	name string
	q    *core.Queue

	mu      sync.Mutex
	holders []*owner // owners on this handle whose hold is not released, oldest first
}

// New returns a Mutex on name over cli. It does no I/O. A bad name returns ErrInvalidName,
// a bad option or a nil client ErrInvalidOption, both wrapped with the detail.
func New(cli *clientv3.Client, name string, opts ...Option) (*Mutex, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("reentrant: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("reentrant %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.Options(opts)
	if err != nil {
		return nil, fmt.Errorf("reentrant %q: %w", name, err)
	}
	return &Mutex{name: name, q: core.NewQueue(cli, core.SessionsFor(cli, cfg), cfg.KeyPrefix(name))}, nil
}

// Lock takes the lock for the owner of ctx and returns the context that carries the hold.
//
// If ctx owns a hold of m (it is, or derives from, a context this Lock or TryLock returned),
// Lock re-enters at once with no RPC: it counts up and returns ctx itself. It fails without
// waiting if the hold was lost (ErrLost) or released (ctx's error; ErrNotLocked for a
// context.WithoutCancel copy that the release could not cancel), or if ctx is done. During
// the last Unlock it waits for its outcome, and re-enters if the release failed.
//
// Otherwise ctx's owner is a new one, which waits in FIFO order with every other waiter on
// the name, also when another owner on this same handle holds the lock. It then writes one
// key, costs what mutex.Lock costs (one Txn uncontended) and watches its key, so that the
// returned context, derived from ctx, is cancelled with cause ErrLost as soon as the hold is
// lost. If ctx ends first, Lock returns ctx's error, wrapped, after deleting its key.
//
// On failure Lock returns ctx unchanged with the error.
func (m *Mutex) Lock(ctx context.Context) (context.Context, error) {
	if o := m.ownerOf(ctx); o != nil {
		if err := o.enter(ctx); err != nil {
			return ctx, m.errorf("lock", err)
		}
		return ctx, nil
	}
	h, err := m.q.Acquire(ctx, core.Spec{Slots: 1, Value: ownerValue()}, nil)
	if err != nil {
		return ctx, m.errorf("lock", err)
	}
	return m.own(ctx, h), nil
}

// TryLock is Lock that never waits: with a context that owns a hold of m it re-enters as
// Lock does; otherwise it takes the lock only if nobody holds it or waits for it, and
// returns ErrLocked having written nothing. One Txn.
func (m *Mutex) TryLock(ctx context.Context) (context.Context, error) {
	if o := m.ownerOf(ctx); o != nil {
		if err := o.enter(ctx); err != nil {
			return ctx, m.errorf("try lock", err)
		}
		return ctx, nil
	}
	h, err := m.q.TryAcquire(ctx, core.Spec{Slots: 1, Value: ownerValue()})
	if err != nil {
		return ctx, m.errorf("try lock", err)
	}
	return m.own(ctx, h), nil
}

// own makes ctx's child the owner of h, with a count of 1, cancelled when h ends.
func (m *Mutex) own(ctx context.Context, h *core.Hold) context.Context {
	octx, cancel := context.WithCancelCause(ctx)
	o := &owner{hold: h, count: 1}
	h.OnEnd(func(err error) { cancel(endCause(err)) })
	m.mu.Lock()
	m.holders = append(m.holders, o)
	m.mu.Unlock()
	return context.WithValue(octx, ownerKey{m}, o)
}

// Unlock counts one Lock of ctx's owner down; the last one releases the lock: one Txn that
// deletes the key only while its create revision is still this hold's, so a late or
// repeated Unlock never frees a newer holder. The last Unlock then cancels the owning
// context (cause context.Canceled).
//
// It returns ErrNotLocked if ctx owns no hold of m (also once it was released, or while
// another goroutine's last Unlock runs), and ErrLost if the hold was lost: every Unlock then
// still counts down, and the last one ends the hold.
// The last Unlock works with a done ctx, such as the owning context after a loss: it then
// runs on context.WithoutCancel(ctx) for at most 5 s. If etcd cannot be reached in time,
// the lock stays held with a count of 1 and Unlock may be called again.
func (m *Mutex) Unlock(ctx context.Context) error {
	o := m.ownerOf(ctx)
	if o == nil {
		return m.errorf("unlock", fmt.Errorf("%w: the context owns no hold of this Mutex", ErrNotLocked))
	}
	last, err := o.exit()
	if !last {
		if err != nil {
			return m.errorf("unlock", err)
		}
		return nil
	}
	ended, err := o.release(ctx)
	if ended {
		m.forget(o)
	}
	o.released(ended)
	if err != nil {
		return m.errorf("unlock", err)
	}
	return nil
}

// Count is how many Locks the owner of ctx has made on m that no Unlock matched yet: 0 when
// ctx owns no hold of m, or once the last Unlock released it. After a loss it counts the
// Unlocks still due. No RPC.
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
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.holders); n > 0 {
		return m.holders[n-1].hold
	}
	return nil
}

// Token is the fencing token of the hold that an owner has through m: its key's create
// revision, strictly increasing across the successive holders of the name. 0 without one.
func (m *Mutex) Token() int64 {
	return m.current().Token()
}

// Done is closed when the hold that an owner has through m ends: by its last Unlock, or
// by loss (then Err is ErrLost). Without a hold it is an already closed channel. The owning
// context tells the same, and is the one to pass to the work done under the lock.
func (m *Mutex) Done() <-chan struct{} {
	return m.current().Done()
}

// Err is nil while an owner holds the lock through m, ErrLost once its hold was lost until
// its last Unlock, and ErrNotLocked without a hold.
func (m *Mutex) Err() error {
	return m.current().Err()
}

// IsOwner is a Txn compare that succeeds only while the hold that an owner has through m
// exists with its key's create revision: put it in the If of every write the lock guards.
// Without a hold it never succeeds.
func (m *Mutex) IsOwner() clientv3.Cmp {
	return m.q.IsOwner(m.current())
}

func (m *Mutex) errorf(op string, err error) error {
	return fmt.Errorf("reentrant %q: %s: %w", m.name, op, err)
}
