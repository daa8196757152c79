package rwmutex_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/rwmutex"
)

func TestReadersOfSeveralClientsHoldAtOnce(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "readers-share"
	admin := cluster.Client(t)
	a, b := newRW(t, cluster.Client(t), name), newRW(t, cluster.Client(t), name)
	require.NoError(t, a.RLock(ctx))
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return b.RLock(ctx) }), 5*time.Second, "a second client's RLock"))
	assert.Equal(t, int64(2), primtest.Keys(t, admin, name))
	assert.NoError(t, a.Err())
	assert.Zero(t, a.Token(), "a read hold has no fencing token")
	require.NoError(t, a.RUnlock(ctx))
	require.NoError(t, b.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
	assert.ErrorIs(t, a.RUnlock(ctx), rwmutex.ErrNotLocked)
}

// TestReadersOfOneHandleShareOneKey: the goroutines reading through one handle write one
// key between them, and all but the first join with no RPC. It counts the requests of its
// own calls (by their ctx) and those that name the group's key, not all of the client's:
// meanwhile the client sets up the sentry the first joiner starts, in the background (its
// watch of the name, and a read of it when other writes moved the revision since the hold,
// as packages that run at once on one cluster do), and renews its lease.
func TestReadersOfOneHandleShareOneKey(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, readers = "one-key", 32
	admin := cluster.Client(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	rw := newRW(t, cli, name)
	require.NoError(t, rw.RLock(ctx))
	key := cluster.Prefix() + rw.Key()
	cnt.Track(key)
	rev := etcdtest.Revision(t, admin)

	joinCtx := rpcstat.WithLabel(ctx, "join")
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() { assert.NoError(t, rw.RLock(joinCtx)) })
	}
	wg.Wait()
	etcdtest.NoWrites(t, admin, rev, "joining readers wrote")
	assert.Empty(t, cnt.Labelled("join"), "joining readers sent requests")
	onKey := cnt.Under(key)
	assert.Zero(t, onKey["Txn"]+onKey["Range"], "joining readers sent KV requests on the group's key: %v", onKey)
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name))

	leaveCtx := rpcstat.WithLabel(ctx, "leave")
	before := cnt.Under(key)
	for range readers {
		require.NoError(t, rw.RUnlock(leaveCtx))
	}
	left := cnt.Under(key).Sub(before)
	assert.Zero(t, left["Txn"]+cnt.Labelled("leave")["Txn"], "a reader that was not the last one out wrote: %v", left)
	assert.Equal(t, int64(readers), left["Range"], "each reader leaving one at a time reads the key once: %v", left)
	etcdtest.NoWrites(t, admin, rev, "a reader that was not the last one out wrote")
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name))
	require.NoError(t, rw.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

func TestWriterWaitsForEveryReader(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "writer-waits"
	admin := cluster.Client(t)
	r1, r2 := newRW(t, cluster.Client(t), name), newRW(t, cluster.Client(t), name)
	require.NoError(t, r1.RLock(ctx))
	require.NoError(t, r2.RLock(ctx))
	w := newRW(t, cluster.Client(t), name)
	locked := etcdtest.Async(func() error { return w.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 3)

	require.NoError(t, r1.RUnlock(ctx))
	primtest.AwaitKeys(t, admin, name, 2)
	etcdtest.Pending(t, locked, "Lock with a reader left")
	require.NoError(t, r2.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, 5*time.Second, "Lock once the readers are gone"))
	assert.NotZero(t, w.Token())
	require.NoError(t, w.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

func TestWriteHoldShutsReadersOut(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "write-excludes"
	admin := cluster.Client(t)
	w := newRW(t, cluster.Client(t), name)
	require.NoError(t, w.Lock(ctx))
	r := newRW(t, cluster.Client(t), name)
	rlocked := etcdtest.Async(func() error { return r.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	etcdtest.Pending(t, rlocked, "RLock under a write hold")
	require.NoError(t, w.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, rlocked, 5*time.Second, "RLock after Unlock"))
	require.NoError(t, r.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestReaderBehindWaitingWriterIsServedAfterIt: FIFO across kinds. A reader arriving while
// a writer waits for other readers waits for the writer, though no writer holds.
func TestReaderBehindWaitingWriterIsServedAfterIt(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "fifo-kinds"
	admin := cluster.Client(t)
	first := newRW(t, cluster.Client(t), name)
	require.NoError(t, first.RLock(ctx))
	w := newRW(t, cluster.Client(t), name)
	locked := etcdtest.Async(func() error { return w.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	late := newRW(t, cluster.Client(t), name)
	rlocked := etcdtest.Async(func() error { return late.RLock(ctx) })
	primtest.AwaitKeys(t, admin, name, 3)

	require.NoError(t, first.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, 5*time.Second, "the writer, once the first reader left"))
	etcdtest.Pending(t, rlocked, "the reader behind the writer")
	require.NoError(t, w.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, rlocked, 5*time.Second, "the reader, after the writer"))
	require.NoError(t, late.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestLocalReadersQueueBehindARemoteWriter: once another client's writer has queued behind
// a handle's read hold, the handle's new readers no longer join that hold (they would
// starve the writer) but queue behind the writer.
func TestLocalReadersQueueBehindARemoteWriter(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "local-behind-remote"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	require.NoError(t, rw.RLock(ctx))
	require.NoError(t, rw.RLock(ctx)) // the watch for writers behind starts with the first joiner
	w := newRW(t, cluster.Client(t), name)
	locked := etcdtest.Async(func() error { return w.Lock(ctx) })
	primtest.AwaitKeys(t, admin, name, 2)

	// The writer's key reaches this client's watch a moment after etcd has it; until then a
	// reader may still join. Within a generous bound, a reader must queue instead.
	deadline := time.Now().Add(10 * time.Second)
	var queued <-chan error
	for queued == nil {
		require.True(t, time.Now().Before(deadline), "local readers kept joining a hold with a writer queued behind it")
		errc := etcdtest.Async(func() error { return rw.RLock(ctx) })
		select {
		case err := <-errc:
			require.NoError(t, err)
			require.NoError(t, rw.RUnlock(ctx)) // joined: the news had not arrived yet
		case <-time.After(200 * time.Millisecond):
			queued = errc
		}
	}
	primtest.AwaitKeys(t, admin, name, 3) // the queued reader has a key of its own, behind the writer
	etcdtest.Pending(t, locked, "the writer, with two readers holding")

	require.NoError(t, rw.RUnlock(ctx))
	require.NoError(t, rw.RUnlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, 5*time.Second, "the writer, once the readers left"))
	etcdtest.Pending(t, queued, "the reader behind the writer")
	require.NoError(t, w.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, queued, 5*time.Second, "the reader, after the writer"))
	require.NoError(t, rw.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestStreamOfLocalReadersDoesNotStarveWriters: goroutines of one handle read in an
// overlapping loop, so their shared hold never empties by itself; a writer of another
// client and one of the same handle are both served, twice each, and the readers are
// served again after each write.
func TestStreamOfLocalReadersDoesNotStarveWriters(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, readers = "no-starvation", 8
	rw := newRW(t, cluster.Client(t), name)
	stop := make(chan struct{})
	read := make(chan struct{}, 1) // a token per read; never blocks a reader
	var writing atomic.Bool
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !assert.NoError(t, rw.RLock(ctx)) {
					return
				}
				assert.False(t, writing.Load(), "a read while a writer holds the lock")
				select {
				case read <- struct{}{}:
				default:
				}
				time.Sleep(5 * time.Millisecond) // a read under the lock: keeps the readers overlapping
				if !assert.NoError(t, rw.RUnlock(ctx)) {
					return
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	etcdtest.Within(t, read, 10*time.Second, "the first read")

	for _, w := range []*rwmutex.RWMutex{newRW(t, cluster.Client(t), name), rw} {
		for range 2 {
			require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return w.Lock(ctx) }), 15*time.Second, "a writer among streaming readers"))
			writing.Store(true)
			select { // forget the reads from before the write
			case <-read:
			default:
			}
			writing.Store(false)
			require.NoError(t, w.Unlock(ctx))
			etcdtest.Within(t, read, 10*time.Second, "a read after the write")
		}
	}
}

// TestOneHandleReadersOverlapWhileItsWriterIsAlone: the goroutines of one handle share it
// as they would a sync.RWMutex.
func TestOneHandleReadersOverlapWhileItsWriterIsAlone(t *testing.T) {
	ctx := etcdtest.Context(t)
	rw := newRW(t, cluster.Client(t), "one-handle")
	var readers, writers, maxReaders atomic.Int64
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			for range 15 {
				if i%4 == 0 {
					if !assert.NoError(t, rw.Lock(ctx)) {
						return
					}
					assert.Equal(t, int64(1), writers.Add(1), "two writers")
					assert.Zero(t, readers.Load(), "a reader beside the writer")
					writers.Add(-1)
					assert.NoError(t, rw.Unlock(ctx))
					continue
				}
				if !assert.NoError(t, rw.RLock(ctx)) {
					return
				}
				n := readers.Add(1)
				for m := maxReaders.Load(); n > m && !maxReaders.CompareAndSwap(m, n); m = maxReaders.Load() {
				}
				assert.Zero(t, writers.Load(), "a writer beside a reader")
				time.Sleep(time.Millisecond)
				readers.Add(-1)
				assert.NoError(t, rw.RUnlock(ctx))
			}
		})
	}
	wg.Wait()
	assert.Greater(t, maxReaders.Load(), int64(1), "the readers never overlapped")
	assert.Zero(t, primtest.Keys(t, cluster.Client(t), "one-handle"))
}

func TestFailedTriesWriteNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "tries"
	admin := cluster.Client(t)
	reader, other := newRW(t, cluster.Client(t), name), newRW(t, cluster.Client(t), name)
	require.NoError(t, reader.TryRLock(ctx))
	require.NoError(t, other.TryRLock(ctx), "TryRLock beside a reader")
	require.NoError(t, reader.TryRLock(ctx), "TryRLock joining this handle's reader")
	assert.Equal(t, int64(2), primtest.Keys(t, admin, name))

	before := etcdtest.Revision(t, admin)
	w := newRW(t, cluster.Client(t), name)
	assert.ErrorIs(t, w.TryLock(ctx), rwmutex.ErrLocked, "TryLock beside readers")
	assert.ErrorIs(t, reader.TryLock(ctx), rwmutex.ErrLocked, "TryLock beside the handle's own readers")
	etcdtest.NoWrites(t, admin, before, "a failed TryLock wrote")
	assert.Zero(t, w.Token())

	require.NoError(t, reader.RUnlock(ctx))
	require.NoError(t, reader.RUnlock(ctx))
	require.NoError(t, other.RUnlock(ctx))
	require.NoError(t, w.TryLock(ctx))
	assert.ErrorIs(t, w.TryLock(ctx), rwmutex.ErrLocked, "TryLock of a handle that holds")
	before = etcdtest.Revision(t, admin)
	assert.ErrorIs(t, reader.TryRLock(ctx), rwmutex.ErrLocked, "TryRLock beside a writer")
	assert.ErrorIs(t, w.TryRLock(ctx), rwmutex.ErrLocked, "TryRLock of the writing handle")
	etcdtest.NoWrites(t, admin, before, "a failed TryRLock wrote")
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name))
	require.NoError(t, w.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestCancelledReadersOfOneGroupLeaveNoKey: several readers of one handle wait in one group,
// on one key, which goes with the last of them to be cancelled. (A cancelled wait of either
// side alone: primtest's TestCancelledWaitReturnsContextErrorAndLeavesNoKey.)
func TestCancelledReadersOfOneGroupLeaveNoKey(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "cancelled"
	admin := cluster.Client(t)
	w := newRW(t, cluster.Client(t), name)
	require.NoError(t, w.Lock(ctx))

	r := newRW(t, cluster.Client(t), name)
	rctx, rcancel := context.WithCancel(ctx)
	first := etcdtest.Async(func() error { return r.RLock(rctx) })
	primtest.AwaitKeys(t, admin, name, 2)
	second := etcdtest.Async(func() error { return r.RLock(rctx) })
	rcancel()
	assert.ErrorIs(t, etcdtest.Within(t, first, 10*time.Second, "a cancelled RLock"), context.Canceled)
	assert.ErrorIs(t, etcdtest.Within(t, second, 10*time.Second, "a cancelled RLock"), context.Canceled)
	assert.Equal(t, int64(1), primtest.Keys(t, admin, name), "a cancelled RLock left its key")
	require.NoError(t, w.Unlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestARevokedLeaseEndsEveryReadHoldOfTheGroup: the readers of one handle share one key;
// when its lease is revoked, each of them is told of the loss. (One hold of either side:
// primtest's TestARevokedLeaseEndsTheHoldAndServesTheNext.)
func TestARevokedLeaseEndsEveryReadHoldOfTheGroup(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "revoked"
	admin := cluster.Client(t)
	r := newRW(t, cluster.Client(t), name)
	require.NoError(t, r.RLock(ctx))
	require.NoError(t, r.RLock(ctx))
	resp, err := admin.Get(ctx, r.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	etcdtest.Within(t, r.Done(), 5*time.Second, "Done after the lease was revoked")
	assert.ErrorIs(t, r.Err(), rwmutex.ErrLost)
	assert.ErrorIs(t, r.RUnlock(ctx), rwmutex.ErrLost)
	assert.ErrorIs(t, r.RUnlock(ctx), rwmutex.ErrLost)
	assert.ErrorIs(t, r.RUnlock(ctx), rwmutex.ErrNotLocked)
	require.NoError(t, r.RLock(ctx), "RLock after a loss takes a new lease")
	require.NoError(t, r.RUnlock(ctx))
	assert.Zero(t, primtest.Keys(t, admin, name))
}

// TestRUnlockWhoseContextEndsMidwayIsNeverALoss: a reader whose RUnlock times out while the
// group's key is being deleted or checked, beside another reader leaving, may be told to try
// again, but neither is ever told the hold was lost (nothing was), and the retry settles it.
func TestRUnlockWhoseContextEndsMidwayIsNeverALoss(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "runlock-timeout"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	retried := 0
	for i := range 150 {
		require.NoError(t, rw.RLock(ctx))
		require.NoError(t, rw.RLock(ctx))
		actx, cancel := context.WithTimeout(ctx, time.Duration(i%50)*100*time.Microsecond)
		a := etcdtest.Async(func() error { return rw.RUnlock(actx) })
		require.NoError(t, rw.RUnlock(ctx), "iteration %d: the other reader", i)
		err := <-a
		cancel()
		if err != nil {
			// The deadline, or etcd's "request timed out" for a request that carried it.
			require.NotErrorIs(t, err, rwmutex.ErrLost, "iteration %d", i)
			retried++
			require.NoError(t, rw.RUnlock(ctx), "iteration %d: the retry", i)
		}
		require.ErrorIs(t, rw.RUnlock(ctx), rwmutex.ErrNotLocked, "iteration %d", i)
		require.Zero(t, primtest.Keys(t, admin, name), "iteration %d", i)
	}
	t.Logf("%d of 150 RUnlocks timed out and were retried", retried)
}
