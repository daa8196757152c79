package trylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/trylock"
)

// slack is what a bound on a duration allows for a busy 2-core machine running -race.
const slack = 3 * time.Second

// long is a backoff whose first delay (at least 5 s with its jitter) a test cannot mistake
// for a wake-up.
var long = trylock.Backoff(10*time.Second, 20*time.Second)

func TestOnceTakesAFreeLock(t *testing.T) {
	ctx := etcdtest.Context(t)
	m := newMutex(t, cluster.Client(t), "once-free")
	require.NoError(t, trylock.Once(ctx, m))
	assert.NotZero(t, m.Token())
	require.NoError(t, m.Unlock(ctx))
}

func TestRetryMakesExactlyAttemptsTries(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "retry-attempts"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))

	for _, n := range []int{1, 4} {
		l := track(newMutex(t, cluster.Client(t), name))
		before := etcdtest.Revision(t, admin)
		err := trylock.Retry(ctx, l, trylock.Attempts(n), trylock.Backoff(10*time.Millisecond, 20*time.Millisecond))
		require.ErrorIs(t, err, trylock.ErrLocked)
		assert.NotErrorIs(t, err, trylock.ErrTimeout)
		assert.Equal(t, int32(n), l.tries.Load(), "tries with Attempts(%d)", n)
		unchanged(t, admin, name, 1, before)
	}
	require.NoError(t, holder.Unlock(ctx))
}

func TestRetryTakesAFreeLockWithOneTry(t *testing.T) {
	ctx := etcdtest.Context(t)
	m := newMutex(t, cluster.Client(t), "retry-free")
	l := track(m)
	require.NoError(t, trylock.Retry(ctx, l, long))
	assert.Equal(t, int32(1), l.tries.Load())
	require.NoError(t, m.Unlock(ctx))
}

func TestRetryReturnsAtOnceOnAnErrorThatIsNotBusy(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli, err := cluster.NewClient()
	require.NoError(t, err)
	require.NoError(t, cli.Close()) // every try now fails, and not because the lock is busy
	l := track(newMutex(t, cli, "retry-not-busy"))

	start := time.Now()
	err = trylock.Retry(ctx, l, long)
	require.Error(t, err)
	assert.NotErrorIs(t, err, trylock.ErrLocked)
	assert.Equal(t, int32(1), l.tries.Load())
	assert.Less(t, time.Since(start), slack)
}

func TestRetryEndsWithCtxCarryingTheLastBusyError(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "retry-deadline"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	l := track(newMutex(t, cluster.Client(t), name))

	before := etcdtest.Revision(t, admin)
	const d = 500 * time.Millisecond
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	err := trylock.Retry(dctx, l, trylock.Backoff(20*time.Millisecond, 50*time.Millisecond))
	elapsed := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, trylock.ErrLocked)
	assert.NotErrorIs(t, err, trylock.ErrTimeout)
	assert.Less(t, elapsed, d+slack)
	assert.Greater(t, l.tries.Load(), int32(2), "tries in %v with backoff 20-50 ms", d)
	unchanged(t, admin, name, 1, before)
	require.NoError(t, holder.Unlock(ctx))
}

func TestRetryReturnsPromptlyWhenCtxIsCancelled(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "retry-cancel"
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	l := track(newMutex(t, cluster.Client(t), name))

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- trylock.Retry(cctx, l, long) }()
	require.ErrorIs(t, etcdtest.Within(t, l.tried, 10*time.Second, "the first try"), trylock.ErrLocked)
	cancel()
	err := etcdtest.Within(t, done, slack, "Retry after cancel")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, trylock.ErrLocked)
	require.NoError(t, holder.Unlock(ctx))
}

func TestRetryWakesWhenTheHolderLetsGo(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "retry-wake"
	admin, cli := cluster.Client(t), cluster.Client(t)
	first, holder := newMutex(t, cluster.Client(t), name), newMutex(t, cli, name)
	warmHold(t, admin, name, 2, first.Lock, holder.Lock, first.Unlock)
	m := newMutex(t, cli, name)
	l := track(m)

	done := make(chan error, 1)
	go func() { done <- trylock.Retry(ctx, l, long) }()
	require.ErrorIs(t, etcdtest.Within(t, l.tried, 10*time.Second, "the first try"), trylock.ErrLocked)
	start := time.Now()
	require.NoError(t, holder.Unlock(ctx))
	// Without the wake the second try would come 5 s or more after the first.
	require.NoError(t, etcdtest.Within(t, done, slack, "Retry after the holder's Unlock"))
	t.Logf("acquired %v after the Unlock", time.Since(start))
	assert.Equal(t, int32(2), l.tries.Load(), "a wake with no release")
	require.NoError(t, m.Unlock(ctx))
}

func TestRetryWithoutReleasesWaitsOutItsBackoff(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "retry-blind"
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	m := newMutex(t, cluster.Client(t), name)
	l := track(m)

	done := make(chan error, 1)
	go func() { done <- trylock.Retry(ctx, blind{l}, trylock.Backoff(time.Second, time.Second)) }()
	require.ErrorIs(t, etcdtest.Within(t, l.tried, 10*time.Second, "the first try"), trylock.ErrLocked)
	start := time.Now()
	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, done, time.Second+slack, "Retry"))
	// The first delay is drawn from [0.5 s, 1 s] (1 s jittered by half, capped at 1 s).
	assert.GreaterOrEqual(t, time.Since(start), 400*time.Millisecond)
	assert.Equal(t, int32(2), l.tries.Load())
	require.NoError(t, m.Unlock(ctx))
}

func TestTimeoutGivesUpAfterDWithErrTimeoutAndErrLocked(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "timeout-busy"
	admin := cluster.Client(t)
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	l := track(newMutex(t, cluster.Client(t), name))

	before := etcdtest.Revision(t, admin)
	const d = time.Second
	start := time.Now()
	err := trylock.Timeout(ctx, l, d)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, trylock.ErrTimeout)
	require.ErrorIs(t, err, mutex.ErrLocked)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "d is Timeout's, not ctx's")
	assert.GreaterOrEqual(t, elapsed, d-50*time.Millisecond)
	assert.Less(t, elapsed, d+slack)
	assert.Greater(t, l.tries.Load(), int32(1))
	unchanged(t, admin, name, 1, before)
	require.NoError(t, holder.Unlock(ctx))
}

func TestTimeoutTakesALockReleasedInTime(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "timeout-released"
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	m := newMutex(t, cluster.Client(t), name)
	l := track(m)

	done := make(chan error, 1)
	go func() { done <- trylock.Timeout(ctx, l, 20*time.Second) }()
	require.ErrorIs(t, etcdtest.Within(t, l.tried, 10*time.Second, "the first try"), trylock.ErrLocked)
	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, done, trylock.DefaultMaxBackoff+slack, "Timeout"))
	assert.NotZero(t, m.Token())
	require.NoError(t, m.Unlock(ctx))
}

func TestTimeoutEndsWithItsParentCtx(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "timeout-parent"
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	l := track(newMutex(t, cluster.Client(t), name))

	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := trylock.Timeout(pctx, l, time.Minute)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, trylock.ErrLocked)
	assert.NotErrorIs(t, err, trylock.ErrTimeout, "the parent's deadline is not Timeout's")
	require.NoError(t, holder.Unlock(ctx))
}

func TestTimeoutOfZeroTriesOnce(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "timeout-zero"
	holder := newMutex(t, cluster.Client(t), name)
	require.NoError(t, holder.Lock(ctx))
	l := track(newMutex(t, cluster.Client(t), name))

	err := trylock.Timeout(ctx, l, 0)
	require.ErrorIs(t, err, trylock.ErrTimeout)
	require.ErrorIs(t, err, trylock.ErrLocked)
	assert.Equal(t, int32(1), l.tries.Load())
	require.NoError(t, holder.Unlock(ctx))
}

func TestBadOptionsFailBeforeAnyTry(t *testing.T) {
	ctx := etcdtest.Context(t)
	l := track(newMutex(t, cluster.Client(t), "bad-options"))
	for _, tc := range []struct {
		name string
		opt  trylock.RetryOption
	}{
		{"no attempts", trylock.Attempts(0)},
		{"negative attempts", trylock.Attempts(-1)},
		{"zero initial", trylock.Backoff(0, time.Second)},
		{"negative initial", trylock.Backoff(-time.Second, time.Second)},
		{"initial over max", trylock.Backoff(2*time.Second, time.Second)},
		{"nil option", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, trylock.Retry(ctx, l, tc.opt), trylock.ErrInvalidOption)
			assert.Zero(t, l.tries.Load())
		})
	}
	require.ErrorIs(t, trylock.Retry(ctx, nil), trylock.ErrInvalidOption)
	require.ErrorIs(t, trylock.Once(ctx, nil), trylock.ErrInvalidOption)
	require.ErrorIs(t, trylock.Timeout(ctx, nil, time.Second), trylock.ErrInvalidOption)
}
