package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// MaxLimit is the highest limit of a semaphore, and so the most units a permit takes:
// 2^31-1. A higher one is [ErrInvalidOption], so that the units held and asked for ahead of
// a waiter can always be summed.
const MaxLimit = core.MaxUnits

// guardTries bounds how often an acquisition reads the limit again after its guard
// failed: only changes coming one after another (SetLimit, an operator's delete) make it
// fail more than once.
const guardTries = 5

// Semaphore is a distributed counting semaphore on one name: at most its limit (etcd's
// record; see the package doc) of units held at once by every client together, in permits
// of one unit (Acquire) or several (AcquireN). It is safe for use by several goroutines; each acquisition takes a permit of its own.
//
// Only [New] makes a usable Semaphore. On the zero Semaphore and a nil *Semaphore, Acquire,
// AcquireN, TryAcquire, TryAcquireN and InUse return [ErrInvalidOption] at once, Limit is 0,
// and WatchRelease never yields.
type Semaphore struct {
	sh       core.Shell
	limit    atomic.Int64 // as etcd last recorded it, to this handle's knowledge; New's until then
	limitKey string
	recorded atomic.Bool // etcd's limit record was found, or written: limit is etcd's
}

// New returns a Semaphore on name over cli, with limit the units to record for a name
// whose limit etcd does not record yet (see the package doc). It does no I/O. Errors,
// wrapped with the detail: [ErrInvalidName] for a bad name, [ErrInvalidOption] for a limit
// below 1 or above [MaxLimit], a bad option or a nil cli.
func New(cli *clientv3.Client, name string, limit int, opts ...Option) (*Semaphore, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("semaphore: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("semaphore %q: %w: nil client", name, ErrInvalidOption)
	}
	if err := core.CheckLimit(limit); err != nil {
		return nil, fmt.Errorf("semaphore %q: %w", name, err)
	}
	cfg, err := core.OptionsFor("a semaphore", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: %w", name, err)
	}
	q, tel := core.NewQueue(cli, cfg, name), core.NewTelemetry(cfg, core.PrimitiveSemaphore, name)
	s := &Semaphore{sh: core.NewShell("semaphore", name, q, tel), limitKey: cfg.KeyPrefix(name) + limitName}
	s.limit.Store(int64(limit))
	return s, nil
}

// specFor is the spec of an acquisition of n units of limit starting now: its key's value
// says who and since when. Core serves it once its n fit beside the units ahead of it, under
// the limit in force while it waits; every write of its key checks, in the same Txn, that
// etcd records limit.
func (s *Semaphore) specFor(n, limit int) core.Spec {
	spec := core.PermitSpec(core.OwnerValue(""), limit, n)
	spec.Tel = s.sh.Tel
	spec.Guard = []clientv3.Cmp{clientv3.Compare(clientv3.Value(s.limitKey), "=", strconv.Itoa(limit))}
	return spec
}

// units checks n, the units an acquisition asks for: at least 1, and at most the limit,
// which it reads from etcd first when n is above Limit (a handle made with a lower limit
// than etcd's, or one that has not seen a raise yet).
func (s *Semaphore) units(ctx context.Context, n int) error {
	if n < 1 {
		return fmt.Errorf("%w: %d units is below 1", ErrInvalidOption, n)
	}
	if n <= s.Limit() {
		return nil
	}
	if limit, err := core.ReadLimit(ctx, s.sh.Q.Client(), s.sh.Q.Prefix()); err != nil {
		return err
	} else if limit != 0 {
		s.limit.Store(int64(limit))
		s.recorded.Store(true)
	}
	if limit := s.Limit(); n > limit {
		return fmt.Errorf("%w: %d units is over the limit of %d", ErrInvalidOption, n, limit)
	}
	return nil
}

// unmade is the Shell of a Semaphore that New did not make.
var unmade = core.Unmade("semaphore")

// shell is the Semaphore's Shell, or unmade.
func (s *Semaphore) shell() *core.Shell {
	if s == nil {
		return unmade
	}
	return s.sh.Or(unmade)
}

// Limit is the number of units as this handle last saw etcd record it, by an acquisition,
// [Semaphore.InUse] or [Semaphore.SetLimit]; New's limit until then; 0 for a Semaphore not
// made by New. It does no I/O.
func (s *Semaphore) Limit() int {
	if s.shell() == unmade {
		return 0
	}
	return int(s.limit.Load())
}

// SetLimit changes the limit of the name to n units, for every handle and client: one Txn,
// a compare-and-swap of etcd's record, made again on what it finds if another change came
// first. A raise serves at once the waiters whose units now fit; after a lowering, permits
// held keep holding and nobody new is served until the units in use fit beside what they
// ask. A waiter asking more units than the new limit fails with [ErrLimitMismatch]. It
// records n if etcd records no limit for the name.
//
// Errors: [ErrInvalidOption] for n below 1 or above [MaxLimit], having sent nothing, and when s was not made by
// [New] or its client is closed. ctx's error, wrapped: with ctx done already, having sent
// nothing; when ctx ends first, the limit may have changed then or not.
//
// Cost: one read and one Txn; one more Txn for a record written before SetLimit existed.
func (s *Semaphore) SetLimit(ctx context.Context, n int) error {
	if err := s.shell().Check("set limit"); err != nil {
		return err
	}
	if err := core.CheckLimit(n); err != nil {
		return s.errorf("set limit", err)
	}
	if err := ctx.Err(); err != nil {
		return s.errorf("set limit", err) // before any I/O
	}
	if err := changeLimit(ctx, s.sh.Q.Client(), s.sh.Q.Prefix(), n); err != nil {
		return s.errorf("set limit", err)
	}
	s.limit.Store(int64(n))
	s.recorded.Store(true)
	return nil
}

// Acquire waits for a permit of one unit: s.AcquireN(ctx, 1).
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return s.acquire(ctx, "acquire", "etcdsync.semaphore.Acquire", 1)
}

// AcquireN waits for a permit of n units, all or none, in FIFO order with every other
// waiter on the name: a waiter is served once its n units fit beside those held and asked
// for ahead of it, so a waiter for many units at the head of the line is not overtaken by
// smaller ones behind it, and two waiters for several units cannot deadlock each other. The
// permit is one key: it is released, lost and fenced as one. The first acquisition on a
// handle reads etcd's limit, or records [Semaphore.Limit] if nobody has.
//
// Errors: [ErrInvalidOption] for n below 1 or above the limit, having written nothing (n
// above Limit costs a read of etcd's limit first), and when s was not made by [New] or its
// client is closed. [ErrLimitMismatch] when the limit is lowered below n while it waits,
// having deleted its key, or keeps changing under it. ctx's error, wrapped, when ctx ends,
// having left no key (see [etcdsync] for how long that may take). [ErrLost]: the session's
// lease expired while waiting.
//
// Cost: one Txn uncontended, one more for the handle's first acquisition (the limit), and
// one lease grant on the client's first use; a waiter adds no RPC once the release that
// serves it arrives on its client's watch of the name.
func (s *Semaphore) AcquireN(ctx context.Context, n int) (*Permit, error) {
	return s.acquire(ctx, "acquire", "etcdsync.semaphore.AcquireN", n)
}

// acquire is AcquireN, reporting errors as op and its span as span.
func (s *Semaphore) acquire(ctx context.Context, op, span string, n int) (_ *Permit, err error) {
	if err := s.shell().Check(op); err != nil {
		return nil, err
	}
	if err := s.units(ctx, n); err != nil {
		return nil, s.errorf(op, err)
	}
	ctx, a := s.sh.Start(ctx, core.Wait, span)
	defer func() { a.End(err) }()
	h, err := s.take(ctx, n, func(ctx context.Context, spec core.Spec) (*core.Hold, error) { return s.sh.Q.Acquire(ctx, spec, nil) })
	a.Held(h)
	if err != nil {
		return nil, s.errorf(op, err)
	}
	return newPermit(s, h, n), nil
}

// TryAcquire takes a permit of one unit only if one is free and nobody waits:
// s.TryAcquireN(ctx, 1).
func (s *Semaphore) TryAcquire(ctx context.Context) (*Permit, error) {
	return s.tryAcquire(ctx, "try acquire", "etcdsync.semaphore.TryAcquire", 1)
}

// TryAcquireN takes a permit of n units only if n are free and nobody waits. It records the
// limit as [Semaphore.AcquireN] does.
//
// Errors: [ErrNoPermits] otherwise, having written nothing. ctx's error, [ErrInvalidOption]
// and [ErrLimitMismatch] (the limit kept changing) as for AcquireN.
//
// Cost: one read-only Txn when the units are not free; when they are, that and the Txn that
// takes them (one Txn in all when n is the whole limit); the limit's record as for
// AcquireN.
func (s *Semaphore) TryAcquireN(ctx context.Context, n int) (*Permit, error) {
	return s.tryAcquire(ctx, "try acquire", "etcdsync.semaphore.TryAcquireN", n)
}

// tryAcquire is TryAcquireN, reporting errors as op and its span as span.
func (s *Semaphore) tryAcquire(ctx context.Context, op, span string, n int) (_ *Permit, err error) {
	if err := s.shell().Check(op); err != nil {
		return nil, err
	}
	if err := s.units(ctx, n); err != nil {
		return nil, s.errorf(op, err)
	}
	ctx, a := s.sh.Start(ctx, core.Try, span)
	defer func() { a.End(err) }()
	h, err := s.take(ctx, n, func(ctx context.Context, spec core.Spec) (*core.Hold, error) { return s.sh.Q.TryAcquire(ctx, spec) })
	a.Held(h)
	if errors.Is(err, core.ErrLocked) { // n == limit: the core's single-slot try
		err = ErrNoPermits
	}
	if err != nil {
		return nil, s.errorf(op, err)
	}
	return newPermit(s, h, n), nil
}

// take runs acquire for n units once the limit is known from etcd, and again after its
// guard found the record changed (a SetLimit, or an operator's delete) and the limit was
// read anew.
func (s *Semaphore) take(ctx context.Context, n int, acquire func(context.Context, core.Spec) (*core.Hold, error)) (*core.Hold, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // before any I/O
	}
	for range guardTries {
		if !s.recorded.Load() {
			limit, err := core.EnsureLimit(ctx, s.sh.Q.Client(), s.sh.Q.Prefix(), s.Limit())
			if err != nil {
				return nil, err
			}
			s.limit.Store(int64(limit))
			s.recorded.Store(true)
		}
		limit := s.Limit()
		if n > limit {
			return nil, fmt.Errorf("%w: %d units is over the limit of %d that etcd records", ErrInvalidOption, n, limit)
		}
		h, err := acquire(ctx, s.specFor(n, limit))
		if c := h.Capacity(); c > 0 {
			s.limit.Store(int64(c)) // a SetLimit while it waited: served under that limit
		}
		if !errors.Is(err, core.ErrGuard) {
			return h, err
		}
		s.recorded.Store(false)
	}
	return nil, fmt.Errorf("%w: the record %s kept changing", ErrLimitMismatch, s.limitKey)
}

// InUse is the number of units held now, by every client: the weight of the permit keys
// in etcd that hold (the oldest, up to Limit; the rest are waiters), read linearizably and
// retried through leader changes of etcd until ctx ends.
//
// Errors: ctx's error, with ctx done already or once it ends. [ErrInvalidOption] as for
// [Semaphore.AcquireN].
//
// Cost: one Range of at most Limit keys, without values.
func (s *Semaphore) InUse(ctx context.Context) (int, error) {
	if err := s.shell().Check("in use"); err != nil {
		return 0, err
	}
	n, limit, err := s.sh.Q.HeldUnits(ctx, permitKind, s.Limit())
	if err != nil {
		return 0, s.errorf("in use", err)
	}
	s.limit.Store(int64(limit))
	return n, nil
}

func (s *Semaphore) errorf(op string, err error) error { return s.shell().Errorf(op, err) }

// WatchRelease lets a caller that retries a failed TryAcquire wake when a permit may have
// come free instead of sleeping blindly; package trylock's Permits adapter uses it. Call
// arm before each TryAcquire: its channel yields once a permit key of the name is deleted
// after that (a Release, a waiter giving up, a lost lease) or the limit changes (its
// marker's delete: a raise may make room), or when the watch cannot tell whether one was,
// so a wake may be spurious. Call stop once done, from any goroutine; arm
// is for one goroutine at a time. On a Semaphore not made by [New], arm's channel never
// yields.
//
// Cost: none of its own. It shares the client's one watch of the name with every waiter
// there (the first registration on a client opens it); neither it nor arm ever blocks.
func (s *Semaphore) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if s.shell() == unmade {
		return core.NoReleases()
	}
	return s.sh.Q.WatchRelease("") // every key of the name but the record: permits and the marker
}

// Resume takes over the permit a [Permit.Detach] let go of, in this process or another,
// with the same key, units and token, as mutex.Resume does a Mutex's hold: one Txn checks
// that the key is still the one the ticket names and takes it over, so a ticket resumes
// once; the permit then renews its lease itself (and revokes it once released) and is
// watched as an acquired one. opts are New's, and must put the keys where the detached
// permit's were (WithPrefix). The permit's Semaphore is not returned: the limit is not
// read, since the permit holds already.
//
// Errors: [ErrInvalidOption] for a malformed ticket, or one whose key is not a permit under
// the prefix; [etcdsync.ErrStaleTicket], saying why, when the permit is gone, was resumed
// already, or its key was taken again: nothing is written then. etcd's error otherwise.
//
// Cost: a LeaseTimeToLive, one Txn and a LeaseKeepAliveOnce, then a watch of the key.
func Resume(ctx context.Context, cli *clientv3.Client, ticket string, opts ...Option) (*Permit, error) {
	t, err := core.ParseTicket(ticket)
	if err != nil {
		return nil, fmt.Errorf("semaphore: resume: %w", err)
	}
	cfg, err := core.OptionsFor("a semaphore", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("semaphore: resume: %w", err)
	}
	name, _, ok := cfg.NameOfKindKey(t.Key, permitKind)
	if !ok {
		return nil, fmt.Errorf("semaphore: resume: %w: the ticket's key %q is not a permit under prefix %q", ErrInvalidOption, t.Key, cfg.Prefix)
	}
	// The limit is a stand-in: a resumed permit is not checked against it (see above).
	s, err := New(cli, name, 1, opts...)
	if err != nil {
		return nil, fmt.Errorf("semaphore: resume: %w", err)
	}
	return s.resume(ctx, t)
}

// Resume is [Resume] on s's name and prefix: a ticket of another name's permit is
// [ErrInvalidOption]. Its cost and errors are Resume's.
func (s *Semaphore) Resume(ctx context.Context, ticket string) (*Permit, error) {
	if err := s.shell().Check("resume"); err != nil {
		return nil, err
	}
	t, err := core.ParseTicket(ticket)
	if err != nil {
		return nil, s.errorf("resume", err)
	}
	return s.resume(ctx, t)
}

func (s *Semaphore) resume(ctx context.Context, t core.Ticket) (*Permit, error) {
	if err := s.shell().Check("resume"); err != nil {
		return nil, err
	}
	shape, ok := core.ParseKey(strings.TrimPrefix(t.Key, s.sh.Q.Prefix()))
	units := shape.Units
	if !ok || shape.Kind != permitKind || !strings.HasPrefix(t.Key, s.sh.Q.Prefix()) {
		return nil, s.errorf("resume", fmt.Errorf("%w: the ticket's key %q is not a permit of this semaphore", ErrInvalidOption, t.Key))
	}
	h, err := s.sh.Q.Resume(ctx, t, s.specFor(units, s.Limit()))
	if err != nil {
		return nil, s.errorf("resume", err)
	}
	s.sh.Tel.Held(h)
	return newPermit(s, h, units), nil
}
