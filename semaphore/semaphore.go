package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The keys under the name: one per permit, bound to its holder's lease, and the limit
// record, without a lease.
const (
	permitKind = core.KindPermit
	limitName  = core.RecordLimit
)

// guardTries bounds how often an acquisition records the limit again after its guard
// failed: only an operator deleting the record meanwhile makes it fail more than once.
const guardTries = 5

// Semaphore is a distributed counting semaphore on one name: at most Limit permits held at
// once by every client together. It is safe for use by several goroutines; each Acquire
// takes a permit of its own.
//
// Only New makes a usable Semaphore. On the zero Semaphore and a nil *Semaphore, Acquire,
// TryAcquire and InUse return ErrInvalidOption at once, Limit is 0, and WatchRelease never
// yields.
type Semaphore struct {
	name     string
	limit    int
	q        *core.Queue
	limitKey string
	spec     core.Spec
	recorded atomic.Bool // etcd's limit record was found, or written, equal to limit
	tel      *core.Telemetry
}

// New returns a Semaphore of limit permits on name over cli. It does no I/O. A bad name
// returns ErrInvalidName; a limit below 1, a bad option or a nil client ErrInvalidOption,
// both wrapped with the detail.
func New(cli *clientv3.Client, name string, limit int, opts ...Option) (*Semaphore, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("semaphore: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("semaphore %q: %w: nil client", name, ErrInvalidOption)
	}
	if limit < 1 {
		return nil, fmt.Errorf("semaphore %q: %w: limit %d is below 1", name, ErrInvalidOption, limit)
	}
	cfg, err := core.Options(opts)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: %w", name, err)
	}
	prefix := cfg.KeyPrefix(name)
	limitKey := prefix + limitName
	return &Semaphore{
		name:     name,
		limit:    limit,
		q:        core.NewQueue(cli, core.SessionsFor(cli, cfg), prefix),
		limitKey: limitKey,
		tel:      core.NewTelemetry(cfg, core.PrimitiveSemaphore, name),
		spec: core.Spec{
			Kind: permitKind, Ahead: permitKind, Slots: limit,
			// Every write of a permit key checks the limit in the same Txn.
			Guard: []clientv3.Cmp{clientv3.Compare(clientv3.Value(limitKey), "=", strconv.Itoa(limit))},
		},
	}, nil
}

// specNow is the spec of an acquisition starting now: its key's value says who and since when.
func (s *Semaphore) specNow() core.Spec {
	spec := s.spec
	spec.Value = core.OwnerValue("")
	return spec
}

// queue is the Semaphore's queue; nil for a Semaphore that New did not make.
func (s *Semaphore) queue() *core.Queue {
	if s == nil {
		return nil
	}
	return s.q
}

// Limit is the number of permits, as given to New; 0 for a Semaphore not made by New.
func (s *Semaphore) Limit() int {
	if s == nil {
		return 0
	}
	return s.limit
}

// Acquire waits for a permit, in FIFO order with every other waiter on the name. Its
// first call on a handle records the limit in etcd if nobody has (one more Txn), or
// returns ErrLimitMismatch, having written nothing, if another limit is recorded. Then it
// costs one Txn uncontended; a waiter adds no RPC once the release that serves it arrives
// on its client's watch. With ctx done already it returns ctx's error, wrapped, having
// sent nothing; if ctx ends first it returns ctx's error after deleting its key (see
// mutex.Mutex.Lock for the bounds). ErrLost means the session's lease expired while
// waiting. ErrInvalidOption: s was not made by New, or its client is closed.
func (s *Semaphore) Acquire(ctx context.Context) (_ *Permit, err error) {
	if err := s.queue().Unusable(); err != nil {
		return nil, s.errorf("acquire", err)
	}
	ctx, a := s.tel.BeginWait(ctx, "etcdsync.semaphore.Acquire")
	defer func() { a.End(err) }()
	h, err := s.take(ctx, func(ctx context.Context) (*core.Hold, error) { return s.q.Acquire(ctx, s.specNow(), nil) })
	a.Held(h)
	if err != nil {
		return nil, s.errorf("acquire", err)
	}
	return newPermit(s, h), nil
}

// TryAcquire takes a permit only if one is free and nobody waits; otherwise it returns
// ErrNoPermits having written nothing. It records the limit as Acquire does. When no
// permit is free it costs one read-only Txn; when one is, that and the Txn that takes it.
// A done ctx and ErrInvalidOption as for Acquire.
func (s *Semaphore) TryAcquire(ctx context.Context) (_ *Permit, err error) {
	if err := s.queue().Unusable(); err != nil {
		return nil, s.errorf("try acquire", err)
	}
	ctx, a := s.tel.BeginTry(ctx, "etcdsync.semaphore.TryAcquire")
	defer func() { a.End(err) }()
	h, err := s.take(ctx, func(ctx context.Context) (*core.Hold, error) { return s.q.TryAcquire(ctx, s.specNow()) })
	a.Held(h)
	if errors.Is(err, core.ErrLocked) { // limit 1: the core's single-slot try
		err = ErrNoPermits
	}
	if err != nil {
		return nil, s.errorf("try acquire", err)
	}
	return newPermit(s, h), nil
}

// take runs acquire once the limit is known to be recorded, and again after its guard
// found the record changed (deleted by an operator) and it was recorded anew.
func (s *Semaphore) take(ctx context.Context, acquire func(context.Context) (*core.Hold, error)) (*core.Hold, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // before any I/O
	}
	for range guardTries {
		if !s.recorded.Load() {
			if err := s.recordLimit(ctx); err != nil {
				return nil, err
			}
		}
		h, err := acquire(ctx)
		if !errors.Is(err, core.ErrGuard) {
			return h, err
		}
		s.recorded.Store(false)
	}
	return nil, fmt.Errorf("%w: the record %s kept changing", ErrLimitMismatch, s.limitKey)
}

// recordLimit writes the limit record unless there is one, and checks that it holds this
// handle's limit.
func (s *Semaphore) recordLimit(ctx context.Context) error {
	want := strconv.Itoa(s.limit)
	got, err := core.Record(ctx, s.q.Client(), s.limitKey, want)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%w: etcd records %q at %s, this handle has %d", ErrLimitMismatch, got, s.limitKey, s.limit)
	}
	s.recorded.Store(true)
	return nil
}

// InUse is the number of permits held now, by every client: the permit keys in etcd, at
// most Limit (the rest are waiters). One Range, linearizable, retried through leader
// changes of etcd until ctx ends (as election's Leader is); with ctx done already, ctx's
// error. ErrInvalidOption as for Acquire.
func (s *Semaphore) InUse(ctx context.Context) (int, error) {
	if err := s.queue().Unusable(); err != nil {
		return 0, s.errorf("in use", err)
	}
	n, err := s.q.Count(ctx, permitKind)
	if err != nil {
		return 0, s.errorf("in use", err)
	}
	return int(min(n, int64(s.limit))), nil
}

func (s *Semaphore) errorf(op string, err error) error {
	if s.queue() == nil {
		return fmt.Errorf("semaphore: %s: %w", op, err)
	}
	return fmt.Errorf("semaphore %q: %s: %w", s.name, op, err)
}
