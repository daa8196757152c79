package misusetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/latch"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
	"github.com/etcdsync/etcdsync/trylock"
)

// A kind says what a call does, and so what it must return in each situation.
type kind int

const (
	takes   kind = iota // may write a key: Lock, TryLock, RLock, Acquire, Campaign, the trylock calls
	reads               // reads etcd and writes nothing: Leader, InUse
	needs               // needs a hold: Unlock, RUnlock, Release, Resign, Proclaim
	reports             // reports on the hold with no I/O; its run is nil when it says "no hold"
	follows             // Observe; its run is nil once the channel has closed
)

// A call is one exported function or method bound to its arguments, its result reduced to
// an error.
type call struct {
	name   string
	kind   kind
	run    func(ctx context.Context) error
	noHold error // for needs: the call's error without a hold (ErrNotLocked, ErrNotLeader)
}

// A primitive is one handle type of the public packages, and the ways to get one.
type primitive struct {
	name string
	// made is the calls of a handle made by New on cli over name; nil for a type New
	// does not make (a Permit). admin evaluates IsOwner's compares.
	made func(t *testing.T, cli, admin *clientv3.Client, name string) []call
	// zero and null are the calls of a zero value and of a nil pointer.
	zero, null func(admin *clientv3.Client) []call
}

// handleType is the primitive of a pointer type *T that New makes, whose methods calls
// binds.
func handleType[T any](name string, newT func(*clientv3.Client, string) (*T, error), calls func(*T, *clientv3.Client) []call) primitive {
	return primitive{
		name: name,
		made: func(t *testing.T, cli, admin *clientv3.Client, name string) []call {
			h, err := newT(cli, name)
			require.NoError(t, err)
			return calls(h, admin)
		},
		zero: func(admin *clientv3.Client) []call { return calls(new(T), admin) },
		null: func(admin *clientv3.Client) []call { return calls(nil, admin) },
	}
}

// testLimit is the limit of the semaphores of the table.
const testLimit = 2

var primitives = []primitive{
	handleType("mutex", func(cli *clientv3.Client, name string) (*mutex.Mutex, error) { return mutex.New(cli, name) }, mutexCalls),
	handleType("mutex.Multi", func(cli *clientv3.Client, name string) (*mutex.Multi, error) {
		return mutex.NewMulti(cli, []string{name, primtest.MultiPartner(name)})
	}, multiCalls),
	handleType("rwmutex", func(cli *clientv3.Client, name string) (*rwmutex.RWMutex, error) { return rwmutex.New(cli, name) }, rwmutexCalls),
	handleType("reentrant", func(cli *clientv3.Client, name string) (*reentrant.Mutex, error) { return reentrant.New(cli, name) }, reentrantCalls),
	handleType("semaphore", func(cli *clientv3.Client, name string) (*semaphore.Semaphore, error) {
		return semaphore.New(cli, name, testLimit)
	}, semaphoreCalls),
	{
		name: "semaphore.Permit",
		zero: func(admin *clientv3.Client) []call { return permitCalls(new(semaphore.Permit), admin) },
		null: func(admin *clientv3.Client) []call { return permitCalls(nil, admin) },
	},
	handleType("election", func(cli *clientv3.Client, name string) (*election.Election, error) { return election.New(cli, name) }, electionCalls),
	handleType("barrier", func(cli *clientv3.Client, name string) (*barrier.Barrier, error) { return barrier.New(cli, name, 2) }, barrierCalls),
	handleType("barrier.Gate", func(cli *clientv3.Client, name string) (*barrier.Gate, error) { return barrier.NewGate(cli, name) }, gateCalls),
	handleType("latch", func(cli *clientv3.Client, name string) (*latch.Latch, error) { return latch.New(cli, name) }, latchCalls),
	{name: "trylock", made: trylockMade, zero: trylockZero, null: trylockNull},
	{name: "package functions", null: packageNull},
}

func mutexCalls(m *mutex.Mutex, admin *clientv3.Client) []call {
	return []call{
		{name: "Lock", kind: takes, run: m.Lock},
		{name: "TryLock", kind: takes, run: m.TryLock},
		{name: "Do", kind: takes, run: scoped(m.Do)},
		{name: "Unlock", kind: needs, run: m.Unlock, noHold: mutex.ErrNotLocked},
		{name: "Token", kind: reports, run: token(m.Token)},
		{name: "Done", kind: reports, run: done(m.Done)},
		{name: "Err", kind: reports, run: noHoldErr(m.Err, mutex.ErrNotLocked)},
		{name: "IsOwner", kind: reports, run: neverOwner(admin, m.IsOwner)},
		{name: "Key", kind: reports, run: noKey(m.Key)},
		{name: "WatchRelease", kind: reports, run: watch(m.WatchRelease)},
	}
}

func multiCalls(m *mutex.Multi, admin *clientv3.Client) []call {
	return []call{
		{name: "Lock", kind: takes, run: m.Lock},
		{name: "TryLock", kind: takes, run: m.TryLock},
		{name: "Do", kind: takes, run: scoped(m.Do)},
		{name: "Unlock", kind: needs, run: m.Unlock, noHold: mutex.ErrNotLocked},
		{name: "Token", kind: reports, run: token(m.Token)},
		{name: "Done", kind: reports, run: done(m.Done)},
		{name: "Err", kind: reports, run: noHoldErr(m.Err, mutex.ErrNotLocked)},
		{name: "IsOwner", kind: reports, run: func(ctx context.Context) error {
			for _, cmp := range m.IsOwner() {
				if err := neverOwner(admin, func() clientv3.Cmp { return cmp })(ctx); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "Keys", kind: reports, run: func(context.Context) error {
			if keys := m.Keys(); keys != nil {
				return fmt.Errorf("keys %q", keys)
			}
			return nil
		}},
		{name: "WatchRelease", kind: reports, run: watch(m.WatchRelease)},
	}
}

func rwmutexCalls(rw *rwmutex.RWMutex, admin *clientv3.Client) []call {
	return []call{
		{name: "RLock", kind: takes, run: rw.RLock},
		{name: "TryRLock", kind: takes, run: rw.TryRLock},
		{name: "Lock", kind: takes, run: rw.Lock},
		{name: "TryLock", kind: takes, run: rw.TryLock},
		{name: "Do", kind: takes, run: scoped(rw.Do)},
		{name: "RDo", kind: takes, run: scoped(rw.RDo)},
		{name: "RUnlock", kind: needs, run: rw.RUnlock, noHold: rwmutex.ErrNotLocked},
		{name: "Unlock", kind: needs, run: rw.Unlock, noHold: rwmutex.ErrNotLocked},
		{name: "ULock", kind: takes, run: rw.ULock},
		{name: "TryULock", kind: takes, run: rw.TryULock},
		{name: "UUnlock", kind: needs, run: rw.UUnlock, noHold: rwmutex.ErrNotLocked},
		{name: "Upgrade", kind: needs, run: rw.Upgrade, noHold: rwmutex.ErrNotLocked},
		{name: "Downgrade", kind: needs, run: rw.Downgrade, noHold: rwmutex.ErrNotLocked},
		{name: "Token", kind: reports, run: token(rw.Token)},
		{name: "Done", kind: reports, run: done(rw.Done)},
		{name: "Err", kind: reports, run: noHoldErr(rw.Err, rwmutex.ErrNotLocked)},
		{name: "IsOwner", kind: reports, run: neverOwner(admin, rw.IsOwner)},
		{name: "Key", kind: reports, run: noKey(rw.Key)},
		{name: "WatchRelease", kind: reports, run: watch(rw.WatchRelease)},
		{name: "WatchWriteRelease", kind: reports, run: watch(rw.WatchWriteRelease)},
	}
}

// reentrantCalls unlock and count with the owning context of the last Lock that took the
// lock, if any, else with the context they are given.
func reentrantCalls(m *reentrant.Mutex, admin *clientv3.Client) []call {
	var owner context.Context
	own := func(ctx context.Context) context.Context {
		if owner != nil {
			return owner
		}
		return ctx
	}
	take := func(lock func(context.Context) (context.Context, error)) func(context.Context) error {
		return func(ctx context.Context) error {
			octx, err := lock(ctx)
			if err == nil {
				owner = octx
			}
			return err
		}
	}
	return []call{
		{name: "Lock", kind: takes, run: take(m.Lock)},
		{name: "TryLock", kind: takes, run: take(m.TryLock)},
		{name: "Do", kind: takes, run: scoped(m.Do)},
		{name: "Unlock", kind: needs, run: func(ctx context.Context) error { return m.Unlock(own(ctx)) }, noHold: reentrant.ErrNotLocked},
		{name: "Count", kind: reports, run: func(ctx context.Context) error {
			if n := m.Count(own(ctx)); n != 0 {
				return fmt.Errorf("count %d", n)
			}
			return nil
		}},
		{name: "Key", kind: reports, run: noKey(m.Key)},
		{name: "Token", kind: reports, run: token(m.Token)},
		{name: "Done", kind: reports, run: done(m.Done)},
		{name: "Err", kind: reports, run: noHoldErr(m.Err, reentrant.ErrNotLocked)},
		{name: "IsOwner", kind: reports, run: neverOwner(admin, m.IsOwner)},
		{name: "WatchRelease", kind: reports, run: watch(m.WatchRelease)},
	}
}

func semaphoreCalls(s *semaphore.Semaphore, _ *clientv3.Client) []call {
	return []call{
		{name: "Do", kind: takes, run: scoped(func(ctx context.Context, fn func(context.Context) error) error { return s.Do(ctx, 1, fn) })},
		{name: "Acquire", kind: takes, run: permitOf(s.Acquire)},
		{name: "TryAcquire", kind: takes, run: permitOf(s.TryAcquire)},
		{name: "AcquireN", kind: takes, run: permitOf(func(ctx context.Context) (*semaphore.Permit, error) { return s.AcquireN(ctx, 2) })},
		{name: "TryAcquireN", kind: takes, run: permitOf(func(ctx context.Context) (*semaphore.Permit, error) { return s.TryAcquireN(ctx, 2) })},
		{name: "InUse", kind: reads, run: func(ctx context.Context) error { _, err := s.InUse(ctx); return err }},
		{name: "Limit", kind: reports, run: func(context.Context) error {
			if n := s.Limit(); n != 0 && n != testLimit {
				return fmt.Errorf("limit %d", n)
			}
			return nil
		}},
		{name: "WatchRelease", kind: reports, run: watch(s.WatchRelease)},
	}
}

// permitOf is an acquisition whose permit, if any, is released at once.
func permitOf(acquire func(context.Context) (*semaphore.Permit, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		p, err := acquire(ctx)
		if err == nil {
			_ = p.Release(context.Background())
		}
		return err
	}
}

func permitCalls(p *semaphore.Permit, admin *clientv3.Client) []call {
	return []call{
		{name: "Release", kind: needs, run: p.Release, noHold: semaphore.ErrNotLocked},
		{name: "Token", kind: reports, run: token(p.Token)},
		{name: "Done", kind: reports, run: done(p.Done)},
		{name: "Err", kind: reports, run: noHoldErr(p.Err, semaphore.ErrNotLocked)},
		{name: "IsOwner", kind: reports, run: neverOwner(admin, p.IsOwner)},
		{name: "Key", kind: reports, run: noKey(p.Key)},
		{name: "Units", kind: reports, run: func(context.Context) error {
			if n := p.Units(); n != 0 {
				return fmt.Errorf("units %d without a hold", n)
			}
			return nil
		}},
	}
}

func electionCalls(e *election.Election, admin *clientv3.Client) []call {
	return []call{
		{name: "Campaign", kind: takes, run: func(ctx context.Context) error { return e.Campaign(ctx, "v") }},
		{name: "Run", kind: takes, run: func(ctx context.Context) error {
			return e.Run(ctx, "v", func(context.Context) error { return errors.New("lead: stop") })
		}},
		{name: "Proclaim", kind: needs, run: func(ctx context.Context) error { return e.Proclaim(ctx, "w") }, noHold: election.ErrNotLeader},
		{name: "Resign", kind: needs, run: e.Resign, noHold: election.ErrNotLeader},
		{name: "Transfer", kind: needs, run: func(ctx context.Context) error { return e.Transfer(ctx, "w") }, noHold: election.ErrNotLeader},
		{name: "Yield", kind: needs, run: e.Yield, noHold: election.ErrNotLeader},
		{name: "RequestTransfer", kind: reads, run: func(ctx context.Context) error {
			_, err := e.RequestTransfer(ctx, "w")
			if errors.Is(err, election.ErrNoLeader) {
				return nil // nobody to ask: fine where reading is
			}
			return err
		}},
		{name: "Asked", kind: reports, run: func(context.Context) error {
			if e.Asked() != nil {
				return errors.New("Asked without leadership is not nil")
			}
			return nil
		}},
		{name: "Leader", kind: reads, run: func(ctx context.Context) error {
			_, err := e.Leader(ctx)
			if errors.Is(err, election.ErrNoLeader) {
				return nil // a read that found nobody: fine where reading is
			}
			return err
		}},
		{name: "Observe", kind: follows, run: func(ctx context.Context) error {
			for range e.Observe(ctx) {
			}
			return nil
		}},
		{name: "Token", kind: reports, run: token(e.Token)},
		{name: "Done", kind: reports, run: done(e.Done)},
		{name: "Err", kind: reports, run: noHoldErr(e.Err, election.ErrNotLeader)},
		{name: "IsOwner", kind: reports, run: neverOwner(admin, e.IsOwner)},
		{name: "Key", kind: reports, run: noKey(e.Key)},
	}
}

// lockerCalls are trylock's functions over l, each releasing what it took with unlock.
func lockerCalls(what string, l trylock.Locker, unlock func() error) []call {
	took := func(err error) error {
		if err == nil && unlock != nil {
			_ = unlock()
		}
		return err
	}
	return []call{
		{name: "Once(" + what + ")", kind: takes, run: func(ctx context.Context) error { return took(trylock.Once(ctx, l)) }},
		{name: "Retry(" + what + ")", kind: takes, run: func(ctx context.Context) error { return took(trylock.Retry(ctx, l)) }},
		{name: "Timeout(" + what + ")", kind: takes, run: func(ctx context.Context) error {
			return took(trylock.Timeout(ctx, l, time.Second))
		}},
	}
}

// adapterCalls are the trylock calls over the adapters of rw, m and s, and the adapters' own
// methods.
func adapterCalls(rw *rwmutex.RWMutex, m *reentrant.Mutex, s *semaphore.Semaphore) []call {
	rl, ml, sl := trylock.RLocker(rw), trylock.Reentrant(m), trylock.Permits(s)
	calls := lockerCalls("RLocker", rl, func() error { return rw.RUnlock(context.Background()) })
	calls = append(calls, lockerCalls("Reentrant", ml, func() error { return m.Unlock(ml.Context()) })...)
	calls = append(calls, lockerCalls("Permits", sl, func() error { return sl.Permit().Release(context.Background()) })...)
	return append(calls, reentrantLockerCalls(ml)...)
}

func reentrantLockerCalls(l *trylock.ReentrantLocker) []call {
	return []call{
		{name: "ReentrantLocker.TryLock", kind: takes, run: l.TryLock},
		{name: "ReentrantLocker.Context", kind: reports, run: func(context.Context) error {
			if ctx := l.Context(); ctx != nil {
				return fmt.Errorf("context %v", ctx)
			}
			return nil
		}},
		{name: "ReentrantLocker.WatchRelease", kind: reports, run: watch(l.WatchRelease)},
	}
}

func permitLockerCalls(l *trylock.PermitLocker[*semaphore.Permit]) []call {
	return []call{
		{name: "PermitLocker.TryLock", kind: takes, run: l.TryLock},
		{name: "PermitLocker.Permit", kind: reports, run: func(context.Context) error {
			if p := l.Permit(); p != nil {
				return fmt.Errorf("permit %v", p)
			}
			return nil
		}},
		{name: "PermitLocker.WatchRelease", kind: reports, run: watch(l.WatchRelease)},
	}
}

func trylockMade(t *testing.T, cli, _ *clientv3.Client, name string) []call {
	m, err := mutex.New(cli, name)
	require.NoError(t, err)
	rw, err := rwmutex.New(cli, name+"-rw")
	require.NoError(t, err)
	rm, err := reentrant.New(cli, name+"-reentrant")
	require.NoError(t, err)
	s, err := semaphore.New(cli, name+"-semaphore", testLimit)
	require.NoError(t, err)
	calls := lockerCalls("Mutex", m, func() error { return m.Unlock(context.Background()) })
	calls = append(calls, adapterCalls(rw, rm, s)...)
	return append(calls, permitLockerCalls(trylock.Permits(s))...)
}

func trylockZero(*clientv3.Client) []call {
	calls := lockerCalls("zero Mutex", new(mutex.Mutex), nil)
	calls = append(calls, adapterCalls(new(rwmutex.RWMutex), new(reentrant.Mutex), new(semaphore.Semaphore))...)
	calls = append(calls, lockerCalls("zero ReentrantLocker", new(trylock.ReentrantLocker), nil)...)
	calls = append(calls, reentrantLockerCalls(new(trylock.ReentrantLocker))...)
	calls = append(calls, lockerCalls("zero PermitLocker", new(trylock.PermitLocker[*semaphore.Permit]), nil)...)
	return append(calls, permitLockerCalls(new(trylock.PermitLocker[*semaphore.Permit]))...)
}

func trylockNull(*clientv3.Client) []call {
	calls := lockerCalls("nil", nil, nil)
	calls = append(calls, lockerCalls("nil *Mutex", (*mutex.Mutex)(nil), nil)...)
	calls = append(calls, lockerCalls("nil *RWMutex", (*rwmutex.RWMutex)(nil), nil)...)
	calls = append(calls, adapterCalls(nil, nil, nil)...)
	calls = append(calls, lockerCalls("Permits(nil Acquirer)", trylock.Permits[*semaphore.Permit](nil), nil)...)
	calls = append(calls, lockerCalls("nil *ReentrantLocker", (*trylock.ReentrantLocker)(nil), nil)...)
	calls = append(calls, reentrantLockerCalls(nil)...)
	calls = append(calls, lockerCalls("nil *PermitLocker", (*trylock.PermitLocker[*semaphore.Permit])(nil), nil)...)
	return append(calls, permitLockerCalls(nil)...)
}

// packageNull are the package functions given a nil client.
func packageNull(*clientv3.Client) []call {
	shutdown := func(f func(context.Context, *clientv3.Client) error) func(context.Context) error {
		return func(ctx context.Context) error { return f(ctx, nil) }
	}
	newWith := func(f func() error) func(context.Context) error { return func(context.Context) error { return f() } }
	return []call{
		{name: "etcdsync.Shutdown", kind: takes, run: shutdown(etcdsync.Shutdown)},
		{name: "mutex.Shutdown", kind: takes, run: shutdown(mutex.Shutdown)},
		{name: "rwmutex.Shutdown", kind: takes, run: shutdown(rwmutex.Shutdown)},
		{name: "reentrant.Shutdown", kind: takes, run: shutdown(reentrant.Shutdown)},
		{name: "semaphore.Shutdown", kind: takes, run: shutdown(semaphore.Shutdown)},
		{name: "election.Shutdown", kind: takes, run: shutdown(election.Shutdown)},
		{name: "mutex.New", kind: takes, run: newWith(func() error { _, err := mutex.New(nil, "n"); return err })},
		{name: "rwmutex.New", kind: takes, run: newWith(func() error { _, err := rwmutex.New(nil, "n"); return err })},
		{name: "reentrant.New", kind: takes, run: newWith(func() error { _, err := reentrant.New(nil, "n"); return err })},
		{name: "semaphore.New", kind: takes, run: newWith(func() error { _, err := semaphore.New(nil, "n", 1); return err })},
		{name: "election.New", kind: takes, run: newWith(func() error { _, err := election.New(nil, "n"); return err })},
	}
}

// The runs of the reports: nil when the report says "no hold".

func token(f func() int64) func(context.Context) error {
	return func(context.Context) error {
		if tok := f(); tok != 0 {
			return fmt.Errorf("token %d", tok)
		}
		return nil
	}
}

func done(f func() <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		if !closed(f()) {
			return errors.New("Done is not closed")
		}
		return nil
	}
}

func noHoldErr(f func() error, want error) func(context.Context) error {
	return func(context.Context) error {
		if err := f(); !errors.Is(err, want) {
			return fmt.Errorf("Err is %v, want %v", err, want)
		}
		return nil
	}
}

func noKey(f func() string) func(context.Context) error {
	return func(context.Context) error {
		if k := f(); k != "" {
			return fmt.Errorf("key %q", k)
		}
		return nil
	}
}

// neverOwner evaluates the compare in a Txn of admin's, on a context of its own (the call's
// may be done): it must be answered, and fail.
func neverOwner(admin *clientv3.Client, f func() clientv3.Cmp) func(context.Context) error {
	return func(context.Context) error {
		cmp := f()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := admin.Txn(ctx).If(cmp).Commit()
		switch {
		case err != nil:
			return fmt.Errorf("the compare on %q: %w", string(cmp.KeyBytes()), err)
		case resp.Succeeded:
			return fmt.Errorf("the compare on %q succeeded", string(cmp.KeyBytes()))
		}
		return nil
	}
}

// watch registers a release watch, arms it once and stops it: none of which may block.
func watch(f func() (func() <-chan struct{}, func())) func(context.Context) error {
	return func(context.Context) error {
		arm, stop := f()
		defer stop()
		arm()
		return nil
	}
}

// errAny in a want list stands for any error.
var errAny = errors.New("any error")

// A situation is a way to use the calls carelessly or unluckily, and what each kind of
// call must then return: every error of the list (errors.Is), or nil for an empty list.
type situation struct {
	name   string
	calls  func(t *testing.T, p primitive, admin *clientv3.Client) []call // nil: no such handle
	ctx    func(testing.TB) context.Context
	within time.Duration // each call returns by then
	want   func(c call) []error
}

// prompt is how soon a call that has nothing to wait for must return.
const prompt = time.Second

var situations = []situation{
	{
		name: "zero value",
		calls: func(_ *testing.T, p primitive, admin *clientv3.Client) []call {
			if p.zero == nil {
				return nil
			}
			return p.zero(admin)
		},
		ctx: etcdtest.Context, within: prompt, want: unmadeWant,
	},
	{
		name: "nil pointer",
		calls: func(_ *testing.T, p primitive, admin *clientv3.Client) []call {
			if p.null == nil {
				return nil
			}
			return p.null(admin)
		},
		ctx: etcdtest.Context, within: prompt, want: unmadeWant,
	},
	{
		name: "context done",
		calls: func(t *testing.T, p primitive, admin *clientv3.Client) []call {
			if p.made == nil {
				return nil
			}
			return p.made(t, cluster.Client(t), admin, "misuse-done-"+p.name)
		},
		ctx:    func(testing.TB) context.Context { return doneContext() },
		within: prompt,
		want: func(c call) []error {
			switch c.kind {
			case takes, reads:
				return []error{context.Canceled}
			case needs:
				return []error{c.noHold}
			}
			return nil
		},
	},
	{
		name: "client closed",
		calls: func(t *testing.T, p primitive, admin *clientv3.Client) []call {
			if p.made == nil {
				return nil
			}
			return p.made(t, closedClient(t), admin, "misuse-closed-"+p.name)
		},
		ctx:    etcdtest.Context,
		within: prompt,
		want: func(c call) []error {
			switch c.kind {
			case takes, reads:
				return []error{errAny}
			case needs:
				return []error{c.noHold}
			}
			return nil
		},
	},
}

// scoped binds a Do to work that does nothing.
func scoped(do func(context.Context, func(context.Context) error) error) func(context.Context) error {
	return func(ctx context.Context) error { return do(ctx, func(context.Context) error { return nil }) }
}

// unmadeWant: a handle New did not make fails every call that would need etcd with
// ErrInvalidOption, and with its no-hold error too where the call needs a hold; it reports
// no hold.
func unmadeWant(c call) []error {
	switch c.kind {
	case takes, reads:
		return []error{core.ErrInvalidOption}
	case needs:
		return []error{core.ErrInvalidOption, c.noHold}
	}
	return nil
}

func barrierCalls(b *barrier.Barrier, _ *clientv3.Client) []call {
	return []call{
		{name: "Enter", kind: takes, run: b.Enter},
		{name: "Leave", kind: needs, run: b.Leave, noHold: barrier.ErrNotEntered},
		{name: "Token", kind: reports, run: token(b.Token)},
		{name: "Round", kind: reports, run: token(b.Round)},
		{name: "Done", kind: reports, run: done(b.Done)},
	}
}

func gateCalls(g *barrier.Gate, _ *clientv3.Client) []call {
	return []call{
		{name: "Hold", kind: takes, run: g.Hold},
		{name: "Release", kind: takes, run: g.Release},
		{name: "Wait", kind: reads, run: g.Wait},
	}
}

func latchCalls(l *latch.Latch, _ *clientv3.Client) []call {
	return []call{
		{name: "Set", kind: takes, run: func(ctx context.Context) error { return l.Set(ctx, 1) }},
		{name: "CountDown", kind: takes, run: l.CountDown},
		{name: "CountDownAs", kind: takes, run: func(ctx context.Context) error { return l.CountDownAs(ctx, "a") }},
		{name: "Await", kind: reads, run: l.Await},
		{name: "Count", kind: reads, run: func(ctx context.Context) error { _, err := l.Count(ctx); return err }},
		{name: "Delete", kind: takes, run: l.Delete},
	}
}
