package semaphore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/semaphore"
)

// acquireNAsync starts an AcquireN and returns where its outcome arrives.
func acquireNAsync(ctx context.Context, s *semaphore.Semaphore, n int) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := s.AcquireN(ctx, n)
		ch <- acquired{p, err}
	}()
	return ch
}

// TestWeightedPermitsNeverExceedTheLimit: goroutines on several clients take permits of 1
// to 4 units of 6, some asking for several units at once; the units held at once never pass
// the limit, and every acquisition is served (two waiters for several units each cannot
// deadlock: a permit's units are taken all at once).
func TestWeightedPermitsNeverExceedTheLimit(t *testing.T) {
	ctx := testContext(t)
	const name, limit, clients, perClient, rounds = "weighted-limit", 6, 3, 3, 8
	var inside, peak, total atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		s := newSemaphore(t, cluster.Client(t), name, limit)
		for g := range perClient {
			wg.Go(func() {
				for r := range rounds {
					n := 1 + (c+g+r)%4
					p, err := s.AcquireN(ctx, n)
					if !assert.NoError(t, err) {
						return
					}
					assert.Equal(t, n, p.Units())
					now := inside.Add(int64(n))
					assert.LessOrEqual(t, now, int64(limit), "more units held than the limit")
					for old := peak.Load(); now > old && !peak.CompareAndSwap(old, now); old = peak.Load() {
					}
					total.Add(1)
					inside.Add(-int64(n))
					assert.NoError(t, p.Release(ctx))
				}
			})
		}
	}
	wg.Wait()
	assert.Equal(t, int64(clients*perClient*rounds), total.Load())
	assert.Greater(t, peak.Load(), int64(1), "never more than one unit held at once: no concurrency")
	assert.Zero(t, permitsOf(t, cluster.Client(t), name))
}

// TestAHeavyWaiterAtTheHeadIsNotOvertaken: with 3 of 4 units held, a waiter for 2 is in
// line before a waiter for 1. The 1 would fit, but is behind the 2: it waits, and a try for
// 1 fails, until the 2 is served or gives up; as golang.org/x/sync/semaphore does.
func TestAHeavyWaiterAtTheHeadIsNotOvertaken(t *testing.T) {
	ctx := testContext(t)
	const name, limit = "weighted-fifo", 4
	admin := cluster.Client(t)
	holder, err := newSemaphore(t, cluster.Client(t), name, limit).AcquireN(ctx, 3)
	require.NoError(t, err)

	heavyCtx, cancelHeavy := context.WithCancel(ctx)
	defer cancelHeavy()
	heavy := acquireNAsync(heavyCtx, newSemaphore(t, cluster.Client(t), name, limit), 2)
	awaitPermits(t, admin, name, 2)
	light := acquireNAsync(ctx, newSemaphore(t, cluster.Client(t), name, limit), 1)
	awaitPermits(t, admin, name, 3)

	s := newSemaphore(t, cluster.Client(t), name, limit)
	_, err = s.TryAcquireN(ctx, 1)
	assert.ErrorIs(t, err, semaphore.ErrNoPermits, "a try jumped the line")
	inUse, err := s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, inUse)
	select {
	case got := <-light:
		t.Fatalf("the waiter for 1 unit overtook the waiter for 2 ahead of it (err %v)", got.err)
	default:
	}

	// The waiter for 2 gives up: the one for 1 now fits beside the holder's 3.
	cancelHeavy()
	assert.ErrorIs(t, etcdtest.Within(t, heavy, 10*time.Second, "the cancelled waiter returns").err, context.Canceled)
	got := etcdtest.Within(t, light, 10*time.Second, "the waiter for 1 unit is served")
	require.NoError(t, got.err)
	inUse, err = s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 4, inUse)

	// Both go: a waiter for all 4 is served.
	all := acquireNAsync(ctx, s, limit)
	awaitPermits(t, admin, name, 3)
	require.NoError(t, got.p.Release(ctx))
	require.NoError(t, holder.Release(ctx))
	whole := etcdtest.Within(t, all, 10*time.Second, "the waiter for every unit is served")
	require.NoError(t, whole.err)
	require.NoError(t, whole.p.Release(ctx))
	assert.Zero(t, permitsOf(t, admin, name))
}

// TestWeightedServesInLineAsUnitsFree: a holder of all 4 units; behind it, waiters for 2,
// 1, 3 and 1 units. Its release serves the 2 and the 1 (3 units); the 3 waits for them,
// and the last 1 waits behind the 3 though it would fit.
func TestWeightedServesInLineAsUnitsFree(t *testing.T) {
	ctx := testContext(t)
	const name, limit = "weighted-line", 4
	admin := cluster.Client(t)
	s := newSemaphore(t, cluster.Client(t), name, limit)
	holder, err := s.AcquireN(ctx, limit)
	require.NoError(t, err)
	weights := []int{2, 1, 3, 1}
	waiters := make([]<-chan acquired, len(weights))
	for i, n := range weights {
		waiters[i] = acquireNAsync(ctx, newSemaphore(t, cluster.Client(t), name, limit), n)
		awaitPermits(t, admin, name, int64(i+2))
	}
	require.NoError(t, holder.Release(ctx))
	first := []acquired{
		etcdtest.Within(t, waiters[0], 10*time.Second, "the waiter for 2 is served"),
		etcdtest.Within(t, waiters[1], 10*time.Second, "the waiter for 1 is served"),
	}
	for _, a := range first {
		require.NoError(t, a.err)
	}
	inUse, err := s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, inUse)
	for i := 2; i < 4; i++ {
		select {
		case got := <-waiters[i]:
			t.Fatalf("waiter %d (%d units) served with 3 of 4 units held and the 3 ahead (err %v)", i, weights[i], got.err)
		default:
		}
	}
	for _, a := range first {
		require.NoError(t, a.p.Release(ctx))
	}
	last := []acquired{
		etcdtest.Within(t, waiters[2], 10*time.Second, "the waiter for 3 is served"),
		etcdtest.Within(t, waiters[3], 10*time.Second, "the last waiter for 1 is served"),
	}
	for _, a := range last {
		require.NoError(t, a.err)
		require.NoError(t, a.p.Release(ctx))
	}
	assert.Zero(t, permitsOf(t, admin, name))
}

// TestAWeightedPermitIsOneKey: a permit of 3 units is one key, named for its units, taken in
// one Txn and released in one; its token, IsOwner and loss are those of that key. The counts
// are the test's calls' own (labelled), not what the client sends meanwhile (lease renewals).
func TestAWeightedPermitIsOneKey(t *testing.T) {
	ctx := rpcstat.WithLabel(testContext(t), "test")
	const name, limit = "weighted-key", 5
	cnt := &rpcstat.Counter{}
	cfg := cluster.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	cli, err := cluster.Open(cfg)
	require.NoError(t, err)
	defer cli.Close()
	admin := cluster.Client(t)
	s := newSemaphore(t, cli, name, limit)
	warm, err := s.Acquire(ctx) // grants the lease and records the limit
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	before := cnt.Labelled("test")
	p, err := s.AcquireN(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, rpcstat.Counts{"Txn": 1}, cnt.Labelled("test").Sub(before), "RPCs of an uncontended AcquireN")
	assert.Equal(t, 3, p.Units())
	assert.Contains(t, p.Key(), "/permit/u3/")
	assert.Equal(t, int64(1), permitsOf(t, admin, name))
	resp, err := admin.Get(ctx, p.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	assert.Equal(t, p.Token(), resp.Kvs[0].CreateRevision)
	txn, err := admin.Txn(ctx).If(p.IsOwner()).Commit()
	require.NoError(t, err)
	assert.True(t, txn.Succeeded, "IsOwner of a held permit")

	// Two units are left: a try for 3 fails, one for 2 takes them.
	_, err = s.TryAcquireN(ctx, 3)
	assert.ErrorIs(t, err, semaphore.ErrNoPermits)
	two, err := s.TryAcquireN(ctx, 2)
	require.NoError(t, err)
	inUse, err := s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, limit, inUse)
	require.NoError(t, two.Release(ctx))

	// Someone deletes the key: the whole permit is lost, its 3 units with it.
	_, err = admin.Delete(ctx, p.Key())
	require.NoError(t, err)
	etcdtest.Within(t, p.Done(), 10*time.Second, "the permit's loss is seen")
	assert.ErrorIs(t, p.Err(), semaphore.ErrLost)
	assert.ErrorIs(t, p.Release(ctx), semaphore.ErrLost)
	assert.Zero(t, p.Units())
	inUse, err = s.InUse(ctx)
	require.NoError(t, err)
	assert.Zero(t, inUse)

	// Released in one Txn, and a second Release says so.
	q, err := s.AcquireN(ctx, limit)
	require.NoError(t, err)
	before = cnt.Labelled("test")
	require.NoError(t, q.Release(ctx))
	assert.Equal(t, rpcstat.Counts{"Txn": 1}, cnt.Labelled("test").Sub(before), "RPCs of a Release of 5 units")
	assert.ErrorIs(t, q.Release(ctx), semaphore.ErrNotLocked)
	txn, err = admin.Txn(ctx).If(q.IsOwner()).Commit()
	require.NoError(t, err)
	assert.False(t, txn.Succeeded, "IsOwner of a released permit")
	assert.Zero(t, permitsOf(t, admin, name))
}

// TestUnitsOutOfRangeAreRefusedAndWriteNothing: n below 1 or above the limit fails at once
// with ErrInvalidOption, on a name whose limit is not even recorded yet.
func TestUnitsOutOfRangeAreRefusedAndWriteNothing(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	s := newSemaphore(t, cli, "weighted-bad", 3)
	before := etcdtest.Revision(t, cli)
	for _, n := range []int{0, -1, 4, 1 << 40} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			p, err := s.AcquireN(ctx, n)
			assert.ErrorIs(t, err, semaphore.ErrInvalidOption)
			assert.Nil(t, p)
			assert.True(t, strings.Contains(err.Error(), "units"), "the error says why: %v", err)
			p, err = s.TryAcquireN(ctx, n)
			assert.ErrorIs(t, err, semaphore.ErrInvalidOption)
			assert.Nil(t, p)
		})
	}
	etcdtest.NoWrites(t, cli, before, "units out of range wrote to etcd")
}

// TestAPermitsUnitsAreHeldUntilItsLeaseGoes: the lease of a holder of 4 units of 4 is
// revoked; the waiter for 3 behind it is served, and the holder's permit reports the loss.
func TestAPermitsUnitsAreHeldUntilItsLeaseGoes(t *testing.T) {
	ctx := testContext(t)
	const name, limit = "weighted-revoke", 4
	admin := cluster.Client(t)
	holderCli := cluster.Client(t)
	p, err := newSemaphore(t, holderCli, name, limit).AcquireN(ctx, limit)
	require.NoError(t, err)
	w := acquireNAsync(ctx, newSemaphore(t, cluster.Client(t), name, limit), 3)
	awaitPermits(t, admin, name, 2)
	resp, err := admin.Get(ctx, p.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	got := etcdtest.Within(t, w, 10*time.Second, "the waiter is served once the holder's lease goes")
	require.NoError(t, got.err)
	etcdtest.Within(t, p.Done(), 10*time.Second, "the holder sees its loss")
	assert.ErrorIs(t, p.Err(), semaphore.ErrLost)
	require.NoError(t, got.p.Release(ctx))
	assert.ErrorIs(t, p.Release(ctx), semaphore.ErrLost)
	assert.Zero(t, permitsOf(t, admin, name))
}
