package securetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
	"github.com/etcdsync/etcdsync/trylock"
)

// served bounds every wait that must end: generous, since a failing test then only takes longer.
const served = 20 * time.Second

// refusedWithin bounds a call that etcd refuses: it must fail at once, not after retries.
const refusedWithin = 5 * time.Second

// locker is one acquisition of a primitive, reduced to what the tests need.
type locker interface {
	lock(ctx context.Context) error // waits in line (or, for trylock.Retry, retries)
	// tryLock takes the lock only if it is free: an error for which busy holds when it is
	// not, errNoTry for a primitive without a try.
	tryLock(ctx context.Context) error
	unlock(ctx context.Context) error
	// token is the hold's fencing token; ok is false for a hold that has none (a read lock).
	token() (tok int64, ok bool)
}

var errNoTry = errors.New("securetest: no try")

// busy reports whether err is a try's answer that the lock is taken.
func busy(err error) bool { return errors.Is(err, core.ErrLocked) || errors.Is(err, core.ErrNoPermits) }

// A kind is a way to contend for a name: first holds it, second then waits for it.
type kind struct {
	name          string
	withPrefix    func(string) core.Option // the package's own WithPrefix
	first, second func(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker
	inLine        bool // second waits with a key in etcd; trylock.Retry writes none while it waits
}

var kinds = []kind{
	{"mutex", mutex.WithPrefix, newMutex, newMutex, true},
	{"rwmutex/write-after-write", rwmutex.WithPrefix, newWriter, newWriter, true},
	{"rwmutex/read-after-write", rwmutex.WithPrefix, newWriter, newReader, true},
	{"rwmutex/write-after-read", rwmutex.WithPrefix, newReader, newWriter, true},
	{"reentrant", reentrant.WithPrefix, newReentrant, newReentrant, true},
	{"semaphore", semaphore.WithPrefix, newSemaphore, newSemaphore, true},
	{"trylock", mutex.WithPrefix, newTrylock, newTrylock, false},
	{"election", election.WithPrefix, newCandidate, newCandidate, true},
}

type mutexLocker struct{ m *mutex.Mutex }

func newMutex(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	m, err := mutex.New(cli, name, opts...)
	require.NoError(t, err)
	return mutexLocker{m}
}

func (l mutexLocker) lock(ctx context.Context) error    { return l.m.Lock(ctx) }
func (l mutexLocker) tryLock(ctx context.Context) error { return l.m.TryLock(ctx) }
func (l mutexLocker) unlock(ctx context.Context) error  { return l.m.Unlock(ctx) }
func (l mutexLocker) token() (int64, bool)              { return l.m.Token(), true }

type writeLocker struct{ rw *rwmutex.RWMutex }

func newWriter(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	rw, err := rwmutex.New(cli, name, opts...)
	require.NoError(t, err)
	return writeLocker{rw}
}

func (l writeLocker) lock(ctx context.Context) error    { return l.rw.Lock(ctx) }
func (l writeLocker) tryLock(ctx context.Context) error { return l.rw.TryLock(ctx) }
func (l writeLocker) unlock(ctx context.Context) error  { return l.rw.Unlock(ctx) }
func (l writeLocker) token() (int64, bool)              { return l.rw.Token(), true }

type readLocker struct{ rw *rwmutex.RWMutex }

func newReader(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	rw, err := rwmutex.New(cli, name, opts...)
	require.NoError(t, err)
	return readLocker{rw}
}

func (l readLocker) lock(ctx context.Context) error    { return l.rw.RLock(ctx) }
func (l readLocker) tryLock(ctx context.Context) error { return l.rw.TryRLock(ctx) }
func (l readLocker) unlock(ctx context.Context) error  { return l.rw.RUnlock(ctx) }
func (l readLocker) token() (int64, bool)              { return 0, false }

// reentrantLocker keeps the owning context of its hold, for unlock.
type reentrantLocker struct {
	m     *reentrant.Mutex
	owner context.Context
}

func newReentrant(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	m, err := reentrant.New(cli, name, opts...)
	require.NoError(t, err)
	return &reentrantLocker{m: m}
}

func (l *reentrantLocker) lock(ctx context.Context) error {
	owner, err := l.m.Lock(ctx)
	if err == nil {
		l.owner = owner
	}
	return err
}

func (l *reentrantLocker) tryLock(ctx context.Context) error {
	owner, err := l.m.TryLock(ctx)
	if err == nil {
		l.owner = owner
	}
	return err
}

// unlock counts down the owner's hold; without one it asks with ctx, which owns nothing.
func (l *reentrantLocker) unlock(ctx context.Context) error {
	if l.owner != nil {
		ctx = l.owner
	}
	return l.m.Unlock(ctx)
}

func (l *reentrantLocker) token() (int64, bool) { return l.m.Token(), true }

// semaphoreLocker has a limit of 1, so that a second permit waits for the first.
type semaphoreLocker struct {
	s      *semaphore.Semaphore
	permit *semaphore.Permit
}

func newSemaphore(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	s, err := semaphore.New(cli, name, 1, opts...)
	require.NoError(t, err)
	return &semaphoreLocker{s: s}
}

func (l *semaphoreLocker) lock(ctx context.Context) error {
	p, err := l.s.Acquire(ctx)
	if err == nil {
		l.permit = p
	}
	return err
}

func (l *semaphoreLocker) tryLock(ctx context.Context) error {
	p, err := l.s.TryAcquire(ctx)
	if err == nil {
		l.permit = p
	}
	return err
}

func (l *semaphoreLocker) unlock(ctx context.Context) error {
	if l.permit == nil {
		return core.ErrNotLocked
	}
	return l.permit.Release(ctx)
}

func (l *semaphoreLocker) token() (int64, bool) {
	if l.permit == nil {
		return 0, true
	}
	return l.permit.Token(), true
}

// trylockLocker takes a mutex by trylock.Retry (lock) and trylock.Once (tryLock).
type trylockLocker struct{ m *mutex.Mutex }

func newTrylock(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	m, err := mutex.New(cli, name, opts...)
	require.NoError(t, err)
	return trylockLocker{m}
}

func (l trylockLocker) lock(ctx context.Context) error {
	return trylock.Retry(ctx, l.m, trylock.Backoff(20*time.Millisecond, 500*time.Millisecond))
}
func (l trylockLocker) tryLock(ctx context.Context) error { return trylock.Once(ctx, l.m) }
func (l trylockLocker) unlock(ctx context.Context) error  { return l.m.Unlock(ctx) }
func (l trylockLocker) token() (int64, bool)              { return l.m.Token(), true }

// candidateLocker campaigns (lock) and resigns (unlock); an election has no try.
type candidateLocker struct{ e *election.Election }

func newCandidate(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) locker {
	e, err := election.New(cli, name, opts...)
	require.NoError(t, err)
	return candidateLocker{e}
}

func (l candidateLocker) lock(ctx context.Context) error   { return l.e.Campaign(ctx, "candidate") }
func (candidateLocker) tryLock(context.Context) error      { return errNoTry }
func (l candidateLocker) unlock(ctx context.Context) error { return l.e.Resign(ctx) }
func (l candidateLocker) token() (int64, bool)             { return l.e.Token(), true }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// async runs f in a goroutine and returns where its result arrives.

// side is a contender's client and the options of its handle.
type side struct {
	cli  *clientv3.Client
	opts []core.Option
}

// contend has a and b contend for name through k: first (on a) takes it; second (on b) finds
// it busy, waits while first holds, and is served once first lets go, with a higher token.
// keys is where name's keys live, as the root client admin sees them; at the end none is
// left there but a semaphore's limit record.
func contend(t *testing.T, k kind, a, b side, admin *clientv3.Client, name, keys string) {
	t.Helper()
	ctx := testContext(t)
	first, second := k.first(t, a.cli, name, a.opts...), k.second(t, b.cli, name, b.opts...)
	require.NoError(t, first.lock(ctx))
	firstToken, firstHas := first.token()
	if err := second.tryLock(ctx); !errors.Is(err, errNoTry) {
		require.True(t, busy(err), "a try while first holds: %v", err)
	}
	held := count(t, admin, keys)
	require.Positive(t, held, "first holds, but no key is under %q", keys)

	secondDone := etcdtest.Async(func() error { return second.lock(ctx) })
	if k.inLine {
		etcdtest.AwaitKeys(t, admin, keys, held+1)
	}
	select {
	case err := <-secondDone:
		t.Fatalf("second served while first holds: %v", err)
	default:
	}
	require.NoError(t, first.unlock(ctx))
	require.NoError(t, etcdtest.Within(t, secondDone, served, "second served after first let go"))
	if secondToken, secondHas := second.token(); firstHas && secondHas {
		assert.Greater(t, secondToken, firstToken, "tokens rise")
	}
	require.NoError(t, second.unlock(ctx))
	assertNoLockKeys(t, admin, keys)
}

// count is the number of keys under prefix.
func count(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(testContext(t), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Count
}

// assertNoLockKeys checks that prefix, a name's keys, holds no key but a semaphore's limit
// record, which outlives every holder by design.
func assertNoLockKeys(t *testing.T, cli *clientv3.Client, prefix string) {
	t.Helper()
	resp, err := cli.Get(testContext(t), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	for _, kv := range resp.Kvs {
		if string(kv.Key) != prefix+core.RecordLimit {
			t.Errorf("key %s left", kv.Key)
		}
	}
}
