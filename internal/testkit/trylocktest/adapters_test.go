package trylock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/trylock"
)

// The primitives are Lockers that wake retries as they are.
var (
	_ trylock.ReleaseWatcher = (*mutex.Mutex)(nil)
	_ trylock.ReleaseWatcher = (*rwmutex.RWMutex)(nil)
)

func newRWMutex(t *testing.T, name string) *rwmutex.RWMutex {
	t.Helper()
	rw, err := rwmutex.New(cluster.Client(t), name)
	require.NoError(t, err)
	return rw
}

func newReentrant(t *testing.T, name string) *reentrant.Mutex {
	t.Helper()
	m, err := reentrant.New(cluster.Client(t), name)
	require.NoError(t, err)
	return m
}

// retryAfterRelease runs Retry on l with a long backoff, lets release go once the first try
// has found the lock busy, and requires Retry to take the lock well before that backoff
// would have let it try again: the release woke it. release must not be the lock of l's
// client's first waiter on the name (see warmHold).
func retryAfterRelease(t *testing.T, l trylock.ReleaseWatcher, busy error, release func(context.Context) error) {
	t.Helper()
	ctx := etcdtest.Context(t)
	tl := track(l)
	done := make(chan error, 1)
	go func() { done <- trylock.Retry(ctx, tl, long) }()
	require.ErrorIs(t, etcdtest.Within(t, tl.tried, 10*time.Second, "the first try"), busy)
	require.NoError(t, release(ctx))
	require.NoError(t, etcdtest.Within(t, done, slack, "Retry after the release"))
	assert.Equal(t, int32(2), tl.tries.Load())
}

func TestRWMutexWriteSideIsALocker(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-write"
	admin := cluster.Client(t)
	reader, rw := newRWMutex(t, name), newRWMutex(t, name)
	require.NoError(t, reader.RLock(ctx))

	before := etcdtest.Revision(t, admin)
	require.ErrorIs(t, trylock.Once(ctx, rw), rwmutex.ErrLocked)
	require.ErrorIs(t, trylock.Retry(ctx, rw, trylock.Attempts(2), trylock.Backoff(time.Millisecond, time.Millisecond)), rwmutex.ErrLocked)
	unchanged(t, admin, name, 1, before)

	require.NoError(t, reader.RUnlock(ctx))
	require.NoError(t, trylock.Once(ctx, rw))
	assert.NotZero(t, rw.Token())
	require.NoError(t, rw.Unlock(ctx))
}

func TestRWMutexWriteRetryWakesWhenAReaderLetsGo(t *testing.T) {
	const name = "adapt-write-wake"
	admin := cluster.Client(t)
	first := newRWMutex(t, name)
	cli := cluster.Client(t)
	holder, err := rwmutex.New(cli, name)
	require.NoError(t, err)
	warmHold(t, admin, name, 2, first.Lock, holder.RLock, first.Unlock)
	rw, err := rwmutex.New(cli, name)
	require.NoError(t, err)

	retryAfterRelease(t, rw, rwmutex.ErrLocked, holder.RUnlock)
	require.NoError(t, rw.Unlock(etcdtest.Context(t)))
}

func TestRLockerTriesTheReadLock(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-read"
	admin := cluster.Client(t)
	writer, reader, rw := newRWMutex(t, name), newRWMutex(t, name), newRWMutex(t, name)
	require.NoError(t, writer.Lock(ctx))

	before := etcdtest.Revision(t, admin)
	require.ErrorIs(t, trylock.Once(ctx, trylock.RLocker(rw)), rwmutex.ErrLocked)
	require.ErrorIs(t, trylock.Timeout(ctx, trylock.RLocker(rw), 200*time.Millisecond), trylock.ErrTimeout)
	unchanged(t, admin, name, 1, before)

	require.NoError(t, writer.Unlock(ctx))
	require.NoError(t, reader.RLock(ctx))
	require.NoError(t, trylock.Once(ctx, trylock.RLocker(rw)), "readers share the lock")
	assert.Equal(t, int64(2), primtest.Keys(t, admin, name))
	require.NoError(t, rw.RUnlock(ctx))
	require.NoError(t, reader.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

func TestRLockerRetryWakesWhenTheWriterLetsGo(t *testing.T) {
	const name = "adapt-read-wake"
	admin := cluster.Client(t)
	first := newRWMutex(t, name)
	cli := cluster.Client(t)
	holder, err := rwmutex.New(cli, name)
	require.NoError(t, err)
	warmHold(t, admin, name, 2, first.Lock, holder.Lock, first.Unlock)
	rw, err := rwmutex.New(cli, name)
	require.NoError(t, err)

	retryAfterRelease(t, trylock.RLocker(rw).(trylock.ReleaseWatcher), rwmutex.ErrLocked, holder.Unlock)
	require.NoError(t, rw.RUnlock(etcdtest.Context(t)))
}

func TestReentrantHandsBackTheOwningContext(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-reentrant"
	admin := cluster.Client(t)
	other, m := newReentrant(t, name), newReentrant(t, name)
	octx, err := other.Lock(ctx)
	require.NoError(t, err)

	before := etcdtest.Revision(t, admin)
	busy := trylock.Reentrant(m)
	require.ErrorIs(t, trylock.Once(ctx, busy), reentrant.ErrLocked)
	assert.Nil(t, busy.Context())
	unchanged(t, admin, name, 1, before)
	require.NoError(t, other.Unlock(octx))

	l := trylock.Reentrant(m)
	require.NoError(t, trylock.Once(ctx, l))
	owning := l.Context()
	require.NotNil(t, owning)
	assert.Equal(t, 1, m.Count(owning))

	again := trylock.Reentrant(m)
	require.NoError(t, trylock.Once(owning, again), "the owning context re-enters")
	assert.Equal(t, 2, m.Count(owning))
	require.NoError(t, m.Unlock(again.Context()))
	require.NoError(t, m.Unlock(owning))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

func TestReentrantRetryWakesWhenTheHolderLetsGo(t *testing.T) {
	const name = "adapt-reentrant-wake"
	admin := cluster.Client(t)
	first := newReentrant(t, name)
	cli := cluster.Client(t)
	holder, err := reentrant.New(cli, name)
	require.NoError(t, err)
	var fctx, hctx context.Context
	warmHold(t, admin, name, 2,
		func(ctx context.Context) (err error) { fctx, err = first.Lock(ctx); return err },
		func(ctx context.Context) (err error) { hctx, err = holder.Lock(ctx); return err },
		func(context.Context) error { return first.Unlock(fctx) })
	m, err := reentrant.New(cli, name)
	require.NoError(t, err)

	l := trylock.Reentrant(m)
	retryAfterRelease(t, l, reentrant.ErrLocked, func(context.Context) error { return holder.Unlock(hctx) })
	require.NoError(t, m.Unlock(l.Context()))
}

// onePermit hands out a real mutex's hold as a permit, busy with ErrNoPermits alone: to
// Permits it is a semaphore of one. Its *mutex.Mutex gives it WatchRelease.
type onePermit struct{ *mutex.Mutex }

type permit struct{ m *mutex.Mutex }

func (s onePermit) TryAcquire(ctx context.Context) (*permit, error) {
	if err := s.TryLock(ctx); err != nil {
		if errors.Is(err, mutex.ErrLocked) {
			return nil, fmt.Errorf("%w (%v)", trylock.ErrNoPermits, err)
		}
		return nil, err
	}
	return &permit{s.Mutex}, nil
}

func (p *permit) Release(ctx context.Context) error { return p.m.Unlock(ctx) }

// unwatched is onePermit without WatchRelease.
type unwatched struct{ s onePermit }

func (u unwatched) TryAcquire(ctx context.Context) (*permit, error) { return u.s.TryAcquire(ctx) }

func TestPermitsHandsBackThePermit(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-permits"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	sem := onePermit{newMutex(t, cluster.Client(t), name)}

	before := etcdtest.Revision(t, admin)
	busy := track(trylock.Permits(sem))
	err := trylock.Retry(ctx, busy, trylock.Attempts(3), trylock.Backoff(time.Millisecond, time.Millisecond))
	require.ErrorIs(t, err, trylock.ErrNoPermits)
	assert.NotErrorIs(t, err, trylock.ErrLocked)
	assert.Equal(t, int32(3), busy.tries.Load(), "ErrNoPermits is busy: tried again")
	err = trylock.Timeout(ctx, trylock.Permits(sem), 200*time.Millisecond)
	require.ErrorIs(t, err, trylock.ErrTimeout)
	require.ErrorIs(t, err, trylock.ErrNoPermits)
	unchanged(t, admin, name, 1, before)
	require.NoError(t, holder.Unlock(ctx))

	l := trylock.Permits(sem)
	assert.Nil(t, l.Permit())
	require.NoError(t, trylock.Once(ctx, l))
	require.NotNil(t, l.Permit())
	require.NoError(t, l.Permit().Release(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

func TestPermitsRetryWakesWhenAPermitIsReleased(t *testing.T) {
	const name = "adapt-permits-wake"
	admin, cli := cluster.Client(t), cluster.Client(t)
	first, holder := newMutex(t, cluster.Client(t), name), newMutex(t, cli, name)
	warmHold(t, admin, name, 2, first.Lock, holder.Lock, first.Unlock)

	l := trylock.Permits(onePermit{newMutex(t, cli, name)})
	retryAfterRelease(t, l, trylock.ErrNoPermits, holder.Unlock)
	require.NoError(t, l.Permit().Release(etcdtest.Context(t)))
}

func TestPermitsOfAnAcquirerWithoutWatchBacksOff(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "adapt-permits-unwatched"
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	l := trylock.Permits(unwatched{onePermit{newMutex(t, cluster.Client(t), name)}})
	arm, stop := l.WatchRelease()
	assert.Nil(t, arm(), "a channel that never yields")
	stop()

	tl := track(l)
	done := make(chan error, 1)
	go func() { done <- trylock.Retry(ctx, tl, trylock.Backoff(20*time.Millisecond, 50*time.Millisecond)) }()
	require.ErrorIs(t, etcdtest.Within(t, tl.tried, 10*time.Second, "the first try"), trylock.ErrNoPermits)
	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, done, slack, "Retry"))
	require.NoError(t, l.Permit().Release(ctx))
}
