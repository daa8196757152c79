package trylock

import (
	"context"
	"fmt"
	"sync"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// Compile-time checks: the primitives are Lockers that tell releases.
var (
	_ ReleaseWatcher = (*mutex.Mutex)(nil)
	_ ReleaseWatcher = (*mutex.Multi)(nil)
	_ ReleaseWatcher = (*rwmutex.RWMutex)(nil)
	_ ReleaseWatcher = readLocker{}
	_ ReleaseWatcher = (*ReentrantLocker)(nil)
	_ ReleaseWatcher = (*PermitLocker[int])(nil)
)

// RLocker returns a Locker whose TryLock is rw.TryRLock, like sync.RWMutex.RLocker. Release
// the read lock it takes with rw.RUnlock. Its retries wake only when a writer lets go, since
// a read lock waits for writers alone. With a nil rw, its TryLock returns ErrInvalidOption.
func RLocker(rw *rwmutex.RWMutex) Locker { return readLocker{rw} }

type readLocker struct{ rw *rwmutex.RWMutex }

func (r readLocker) TryLock(ctx context.Context) error { return r.rw.TryRLock(ctx) }

func (r readLocker) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	return r.rw.WatchWriteRelease()
}

// ReentrantLocker adapts a reentrant.Mutex to Locker: its TryLock keeps the owning context
// that the Mutex's TryLock returns, for Context to hand back. Use one per acquisition.
type ReentrantLocker struct {
	m *reentrant.Mutex

	mu  sync.Mutex
	ctx context.Context
}

// Reentrant returns a Locker over m. After a TryLock (or a Once, Retry or Timeout) that took
// the lock, Context is the owning context: run the work under it and pass it to m.Unlock.
// It lives as long as the hold, also after Timeout (see reentrant.Mutex.Lock). With a nil
// m, TryLock returns ErrInvalidOption.
func Reentrant(m *reentrant.Mutex) *ReentrantLocker { return &ReentrantLocker{m: m} }

// TryLock is m.TryLock(ctx). A ctx that owns a hold of m re-enters it, as with m.TryLock.
// On a nil or zero ReentrantLocker, or one over a nil m, it returns ErrInvalidOption.
func (l *ReentrantLocker) TryLock(ctx context.Context) error {
	if l == nil {
		return fmt.Errorf("trylock: reentrant: %w: nil *ReentrantLocker", ErrInvalidOption)
	}
	octx, err := l.m.TryLock(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.ctx = octx
	l.mu.Unlock()
	return nil
}

// Context is the owning context that the last successful TryLock returned, nil before one.
func (l *ReentrantLocker) Context() context.Context {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctx
}

// WatchRelease is m.WatchRelease: see ReleaseWatcher.
func (l *ReentrantLocker) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if l == nil {
		return core.NoReleases()
	}
	return l.m.WatchRelease()
}

// An Acquirer hands out permits of type P without waiting: a *semaphore.Semaphore is an
// Acquirer[*semaphore.Permit]. TryAcquire returns ErrNoPermits (or ErrLocked) when busy.
type Acquirer[P any] interface {
	TryAcquire(ctx context.Context) (P, error)
}

// PermitLocker adapts an Acquirer to Locker: its TryLock keeps the permit that TryAcquire
// returns, for Permit to hand back. Use one per acquisition.
type PermitLocker[P any] struct {
	a Acquirer[P]

	mu     sync.Mutex
	permit P
}

// Permits returns a Locker over a, such as a *semaphore.Semaphore (P is inferred):
//
//	l := trylock.Permits(sem)
//	if err := trylock.Timeout(ctx, l, 5*time.Second); err != nil {
//		return err
//	}
//	defer l.Permit().Release(context.Background())
//
// If a has a WatchRelease method (see ReleaseWatcher), retries wake on releases; otherwise
// they wait out their backoff. With a nil a (or a nil *semaphore.Semaphore), TryLock
// returns ErrInvalidOption.
func Permits[P any](a Acquirer[P]) *PermitLocker[P] { return &PermitLocker[P]{a: a} }

// An AcquirerN hands out permits of several units without waiting: a
// *semaphore.Semaphore is an AcquirerN[*semaphore.Permit]. TryAcquireN returns ErrNoPermits
// when fewer than n units are free.
type AcquirerN[P any] interface {
	TryAcquireN(ctx context.Context, n int) (P, error)
}

// PermitsN is Permits for permits of n units: its TryLock is a.TryAcquireN(ctx, n), which
// takes all n units or none, so that Retry and Timeout never hold part of them:
//
//	l := trylock.PermitsN(sem, 4)
//	if err := trylock.Timeout(ctx, l, 5*time.Second); err != nil {
//		return err
//	}
//	defer l.Permit().Release(context.Background())
//
// With a nil a, TryLock returns ErrInvalidOption; with n out of a's range, whatever
// TryAcquireN says (ErrInvalidOption for a Semaphore).
func PermitsN[P any](a AcquirerN[P], n int) *PermitLocker[P] {
	if isNil(a) {
		return &PermitLocker[P]{}
	}
	return &PermitLocker[P]{a: units[P]{a: a, n: n}}
}

// units is an AcquirerN seen as an Acquirer of n units, with a's WatchRelease if it has one.
type units[P any] struct {
	a AcquirerN[P]
	n int
}

func (u units[P]) TryAcquire(ctx context.Context) (P, error) { return u.a.TryAcquireN(ctx, u.n) }

func (u units[P]) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if w, ok := any(u.a).(interface {
		WatchRelease() (func() <-chan struct{}, func())
	}); ok {
		return w.WatchRelease()
	}
	return core.NoReleases()
}

// TryLock is a.TryAcquire(ctx), keeping the permit when it succeeds. On a nil or zero
// PermitLocker, or one over a nil Acquirer, it returns ErrInvalidOption.
func (l *PermitLocker[P]) TryLock(ctx context.Context) error {
	if l == nil || isNil(l.a) {
		return fmt.Errorf("trylock: permits: %w: nil Acquirer", ErrInvalidOption)
	}
	p, err := l.a.TryAcquire(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.permit = p
	l.mu.Unlock()
	return nil
}

// Permit is the permit that the last successful TryLock took, the zero P before one.
func (l *PermitLocker[P]) Permit() P {
	if l == nil {
		var none P
		return none
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.permit
}

// WatchRelease is a's, if a has one; otherwise arm returns a nil channel, which never yields.
func (l *PermitLocker[P]) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if l == nil || isNil(l.a) {
		return core.NoReleases()
	}
	if w, ok := any(l.a).(interface {
		WatchRelease() (func() <-chan struct{}, func())
	}); ok {
		return w.WatchRelease()
	}
	return core.NoReleases()
}
