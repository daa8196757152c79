package primtest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
	"github.com/etcdsync/etcdsync/trylock"
)

// Locker is one handle of a primitive, reduced to one hold at a time. Safe for use by one
// goroutine at a time, with accessors that may be called from another.
type Locker interface {
	Lock(ctx context.Context) error // waits in line (trylock: retries)
	// TryLock takes the hold only if it is free: an error matching the Kind's Busy when it
	// is not, ErrNoTry for a primitive without a try (an election).
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
	Token() int64 // 0 without a hold, and always for a read hold
	Key() string
	Err() error
	Done() <-chan struct{}
	IsOwner() clientv3.Cmp
}

// Doer is a Locker that can run work scoped to a hold (Do; the read side's RDo; a
// semaphore's Do of its units). Every kind but the election is one.
type Doer interface {
	Do(ctx context.Context, fn func(ctx context.Context) error) error
}

// ErrNoTry is TryLock's answer for a primitive that has no try.
var ErrNoTry = errors.New("primtest: no try")

// Open makes a handle on name over cli, without I/O; a handle New refused is a nil Locker.
type Open func(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error)

// A Kind is a way to contend for a name: First's hold makes Second wait.
type Kind struct {
	Name string
	// Package is the package whose New First calls, and whose options these are.
	Package     string
	First       Open
	Second      Open
	WithTTL     func(time.Duration) core.Option
	WithSession func(*concurrency.Session) core.Option
	WithPrefix  func(string) core.Option
	// Keys is where the keys of name's holds and waiters are (a semaphore's limit record
	// is not among them), under the default prefix.
	Keys func(name string) string
	// InLine: Second waits with a key in etcd; trylock.Retry writes none while it waits.
	InLine bool
	// Reads: Second takes a read hold, which others share, with no token, never IsOwner.
	Reads bool
	// Busy is what Second's TryLock answers while First holds; nil without a try.
	Busy error
	// NotHeld is what Unlock and Err answer without a hold; it matches ErrNotLocked.
	NotHeld error
	// KeyWhileWaiting: Key names the waiter's key while Lock waits, not only the hold's.
	KeyWhileWaiting bool
}

// Limit is the limit of the semaphores of the table: one permit, so that a second waits.
const Limit = 1

// PermitKeys is where the permits of name are: every key but the limit record.
func PermitKeys(name string) string { return core.NamePrefix(name) + core.KindPermit }

// Kinds is every primitive, and each way an rwmutex's two sides exclude each other.
var Kinds = []Kind{
	kind("mutex", "mutex", openMutex, mutex.WithTTL, mutex.WithSession, mutex.WithPrefix, func(k *Kind) {
		k.KeyWhileWaiting = true
	}),
	kind("rwmutex/write-after-write", "rwmutex", openWriter, rwmutex.WithTTL, rwmutex.WithSession, rwmutex.WithPrefix, nil),
	kind("rwmutex/read-after-write", "rwmutex", openWriter, rwmutex.WithTTL, rwmutex.WithSession, rwmutex.WithPrefix, func(k *Kind) {
		k.Second, k.Reads = openReader, true
	}),
	kind("rwmutex/write-after-read", "rwmutex", openReader, rwmutex.WithTTL, rwmutex.WithSession, rwmutex.WithPrefix, func(k *Kind) {
		k.Second = openWriter
	}),
	kind("reentrant", "reentrant", openReentrant, reentrant.WithTTL, reentrant.WithSession, reentrant.WithPrefix, nil),
	kind("semaphore", "semaphore", openSemaphore, semaphore.WithTTL, semaphore.WithSession, semaphore.WithPrefix, func(k *Kind) {
		k.Keys, k.Busy = PermitKeys, semaphore.ErrNoPermits
	}),
	kind("trylock", "mutex", openTrylock, mutex.WithTTL, mutex.WithSession, mutex.WithPrefix, func(k *Kind) {
		k.InLine = false
	}),
	kind("mutex.multi", "mutex.multi", openMulti, mutex.WithTTL, mutex.WithSession, mutex.WithPrefix, func(k *Kind) {
		k.KeyWhileWaiting = true
	}),
	kind("election", "election", openCandidate, election.WithTTL, election.WithSession, election.WithPrefix, func(k *Kind) {
		k.Busy, k.NotHeld = nil, election.ErrNotLeader
	}),
}

// The openers of the table's kinds, for a test that needs one of them.
var (
	OpenMutex     Open = openMutex
	OpenTrylock   Open = openTrylock
	OpenWriter    Open = openWriter
	OpenReader    Open = openReader
	OpenReentrant Open = openReentrant
	OpenSemaphore Open = openSemaphore
	OpenCandidate Open = openCandidate
	OpenMulti     Open = openMulti
)

// kind is the Kind called name, of package pkg, whose First and Second open, with what
// most kinds share (keys under the name, a waiter in line, ErrLocked for a busy try,
// ErrNotLocked without a hold), as adjust leaves it.
func kind(name, pkg string, open Open, ttl func(time.Duration) core.Option, session func(*concurrency.Session) core.Option,
	prefix func(string) core.Option, adjust func(*Kind)) Kind {
	k := Kind{
		Name: name, Package: pkg, First: open, Second: open,
		WithTTL: ttl, WithSession: session, WithPrefix: prefix,
		Keys: core.NamePrefix, InLine: true,
		Busy: core.ErrLocked, NotHeld: core.ErrNotLocked,
	}
	if adjust != nil {
		adjust(&k)
	}
	return k
}

// handle is the Locker of h, or nil if New refused to make h.
func handle[T any](h *T, err error, wrap func(*T) Locker) (Locker, error) {
	if h == nil {
		return nil, err
	}
	return wrap(h), err
}

// openMutex opens a mutex.Mutex.
func openMutex(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	m, err := mutex.New(cli, name, opts...)
	return handle(m, err, func(m *mutex.Mutex) Locker { return m })
}

type trylockLocker struct{ *mutex.Mutex }

// openTrylock opens a mutex.Mutex that Lock takes by trylock.Retry and TryLock by
// trylock.Once.
func openTrylock(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	m, err := mutex.New(cli, name, opts...)
	return handle(m, err, func(m *mutex.Mutex) Locker { return trylockLocker{m} })
}

func (l trylockLocker) Lock(ctx context.Context) error {
	return trylock.Retry(ctx, l.Mutex, trylock.Backoff(20*time.Millisecond, 500*time.Millisecond))
}

func (l trylockLocker) TryLock(ctx context.Context) error { return trylock.Once(ctx, l.Mutex) }

// openMulti opens a mutex.Multi on name and MultiPartner(name): the table's checks look at
// name, which its Key, IsOwner and the Kind's Keys are about; the fence over every name and
// the partner's keys are mutex's own tests.
func openMulti(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	m, err := mutex.NewMulti(cli, []string{name, MultiPartner(name)}, opts...)
	return handle(m, err, func(m *mutex.Multi) Locker { return &MultiLocker{Multi: m, name: name} })
}

// MultiPartner is the other name of the table's Multi on name: as long as name, so that a
// name of the longest length has a partner too, and outside every other name of the tests.
func MultiPartner(name string) string {
	if name == "" {
		return "~"
	}
	return "~" + name[1:]
}

// MultiLocker is a mutex.Multi as the table and the fault harness drive one: Key and
// IsOwner are those of the name it was opened on; Owners fences on every name.
type MultiLocker struct {
	*mutex.Multi
	name string
}

// NewMultiLocker is m as a Locker whose Key and IsOwner are those of name, one of m's names.
func NewMultiLocker(m *mutex.Multi, name string) *MultiLocker {
	return &MultiLocker{Multi: m, name: name}
}

func (l *MultiLocker) index() int {
	for i, n := range l.Names() {
		if n == l.name {
			return i
		}
	}
	return 0
}

// Key is the Multi's key of the name, while it holds or waits; else "".
func (l *MultiLocker) Key() string {
	if keys := l.Keys(); len(keys) > 0 {
		return keys[l.index()]
	}
	return ""
}

// IsOwner is the Multi's compare on the name.
func (l *MultiLocker) IsOwner() clientv3.Cmp { return l.Multi.IsOwner()[l.index()] }

// Owners are the Multi's compares on every name (faulttest.Owners).
func (l *MultiLocker) Owners() []clientv3.Cmp { return l.Multi.IsOwner() }

// openWriter opens the write side of an rwmutex.RWMutex.
func openWriter(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	rw, err := rwmutex.New(cli, name, opts...)
	return handle(rw, err, func(rw *rwmutex.RWMutex) Locker { return rw })
}

// openReader opens the read side of an rwmutex.RWMutex.
func openReader(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	rw, err := rwmutex.New(cli, name, opts...)
	return handle(rw, err, func(rw *rwmutex.RWMutex) Locker { return readLocker{rw} })
}

// readLocker is the read side; Done, Err, Key and IsOwner are the RWMutex's.
type readLocker struct{ *rwmutex.RWMutex }

func (l readLocker) Lock(ctx context.Context) error    { return l.RLock(ctx) }
func (l readLocker) TryLock(ctx context.Context) error { return l.TryRLock(ctx) }
func (l readLocker) Unlock(ctx context.Context) error  { return l.RUnlock(ctx) }
func (l readLocker) Token() int64                      { return 0 }
func (l readLocker) Do(ctx context.Context, fn func(context.Context) error) error {
	return l.RDo(ctx, fn)
}

// openReentrant opens a reentrant.Mutex, whose Unlock uses the owning context of its hold.
func openReentrant(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	m, err := reentrant.New(cli, name, opts...)
	return handle(m, err, func(m *reentrant.Mutex) Locker { return &reentrantLocker{Mutex: m} })
}

// reentrantLocker keeps the owning context of its hold, for Unlock.
type reentrantLocker struct {
	*reentrant.Mutex
	mu    sync.Mutex
	owner context.Context
}

func (l *reentrantLocker) Lock(ctx context.Context) error    { return l.own(l.Mutex.Lock(ctx)) }
func (l *reentrantLocker) TryLock(ctx context.Context) error { return l.own(l.Mutex.TryLock(ctx)) }

func (l *reentrantLocker) own(owner context.Context, err error) error {
	if err == nil {
		l.mu.Lock()
		l.owner = owner
		l.mu.Unlock()
	}
	return err
}

// Unlock counts down the owner's hold, on the owning context but ending when ctx does;
// without an owner it asks with ctx, which owns nothing.
func (l *reentrantLocker) Unlock(ctx context.Context) error {
	l.mu.Lock()
	owner := l.owner
	l.mu.Unlock()
	if owner == nil {
		return l.Mutex.Unlock(ctx)
	}
	octx, cancel := context.WithCancel(context.WithoutCancel(owner))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	err := l.Mutex.Unlock(octx)
	if err == nil || errors.Is(err, reentrant.ErrLost) {
		l.mu.Lock()
		l.owner = nil // released, or lost: the next Unlock has no owner
		l.mu.Unlock()
	}
	return err
}

// openSemaphore opens a semaphore.Semaphore of Limit, whose Lock takes a permit and Unlock
// releases it.
func openSemaphore(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	s, err := semaphore.New(cli, name, Limit, opts...)
	return handle(s, err, func(s *semaphore.Semaphore) Locker { return NewPermits(s, 1) })
}

// Permits is a Semaphore as a lock, as the fault harness drives one too: Lock takes a permit
// of its units (AcquireN), TryLock tries to (TryAcquireN), Unlock releases it. It holds one
// permit at a time; without one, its calls go to a nil Permit.
type Permits struct {
	s     *semaphore.Semaphore
	units int
	mu    sync.Mutex
	p     *semaphore.Permit
}

// NewPermits returns s as a lock whose permits are of units units.
func NewPermits(s *semaphore.Semaphore, units int) *Permits { return &Permits{s: s, units: units} }

func (l *Permits) Lock(ctx context.Context) error { return l.keep(l.s.AcquireN(ctx, l.units)) }
func (l *Permits) TryLock(ctx context.Context) error {
	return l.keep(l.s.TryAcquireN(ctx, l.units))
}

func (l *Permits) keep(p *semaphore.Permit, err error) error {
	if err == nil {
		l.mu.Lock()
		l.p = p
		l.mu.Unlock()
	}
	return err
}

func (l *Permits) permit() *semaphore.Permit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p
}

// Units is how many units its permits take (faulttest.Units).
func (l *Permits) Units() int { return l.units }

func (l *Permits) Unlock(ctx context.Context) error { return l.permit().Release(ctx) }

// Do runs fn under a permit of its units (Semaphore.Do); while fn runs, Token, IsOwner and
// the others are that permit's.
func (l *Permits) Do(ctx context.Context, fn func(context.Context) error) error {
	if fn == nil {
		return l.s.Do(ctx, l.units, nil) // refused as it is
	}
	return l.s.Do(ctx, l.units, func(ctx context.Context) error {
		l.keep(l.s.PermitOf(ctx), nil)
		return fn(ctx)
	})
}
func (l *Permits) Token() int64           { return l.permit().Token() }
func (l *Permits) Key() string            { return l.permit().Key() }
func (l *Permits) Err() error             { return l.permit().Err() }
func (l *Permits) Done() <-chan struct{}  { return l.permit().Done() }
func (l *Permits) Asked() <-chan struct{} { return l.permit().Asked() }
func (l *Permits) IsOwner() clientv3.Cmp  { return l.permit().IsOwner() }

// openCandidate opens an election.Election as a Candidate.
func openCandidate(cli *clientv3.Client, name string, opts ...core.Option) (Locker, error) {
	e, err := election.New(cli, name, opts...)
	return handle(e, err, func(e *election.Election) Locker { return candidateLocker{NewCandidate(e)} })
}

// Candidate is an Election as a lock, as the fault harness drives one too: Lock campaigns,
// with a value of its own each time ("term-1", "term-2", ...), and Unlock resigns. It has
// no TryLock: an election has no try.
type Candidate struct {
	*election.Election
	terms atomic.Int64
}

// NewCandidate is the Candidate of e.
func NewCandidate(e *election.Election) *Candidate { return &Candidate{Election: e} }

func (c *Candidate) Lock(ctx context.Context) error {
	return c.Campaign(ctx, "term-"+strconv.FormatInt(c.terms.Add(1), 10))
}

func (c *Candidate) Unlock(ctx context.Context) error { return c.Resign(ctx) }

// candidateLocker is a Candidate in the table, whose TryLock says there is none.
type candidateLocker struct{ *Candidate }

func (candidateLocker) TryLock(context.Context) error { return ErrNoTry }
