package semaphore_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/semaphore"
)

// TestNeverMoreThanTheLimitAcrossClientsAndTheLimitIsReached: goroutines on several
// clients cycle permits; the first holders keep theirs until the limit is reached, so
// that a semaphore that admits fewer than its limit fails as surely as one that admits more.
func TestNeverMoreThanTheLimitAcrossClientsAndTheLimitIsReached(t *testing.T) {
	ctx := testContext(t)
	const name, limit, clients, perClient, rounds = "limit", 3, 4, 2, 6
	var inside, peak, total atomic.Int64
	reached := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range clients {
		s := newSemaphore(t, cluster.Client(t), name, limit)
		for range perClient {
			wg.Go(func() {
				for range rounds {
					p, err := s.Acquire(ctx)
					if !assert.NoError(t, err) {
						return
					}
					n := inside.Add(1)
					assert.LessOrEqual(t, n, int64(limit), "more holders than the limit")
					for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
					}
					if n == limit {
						once.Do(func() { close(reached) })
					}
					select { // the first holders wait for company
					case <-reached:
					case <-time.After(10 * time.Second):
					}
					total.Add(1)
					inside.Add(-1)
					assert.NoError(t, p.Release(ctx))
				}
			})
		}
	}
	wg.Wait()
	assert.Equal(t, int64(limit), peak.Load(), "peak concurrency")
	assert.Equal(t, int64(clients*perClient*rounds), total.Load())
	assert.Zero(t, permitsOf(t, cluster.Client(t), name))
}

func TestWaitersAreServedInArrivalOrder(t *testing.T) {
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			ctx := testContext(t)
			name := fmt.Sprintf("fifo-%d", limit)
			const waiters = 5
			admin := cluster.Client(t)
			holders := make([]*semaphore.Permit, limit)
			for i := range holders {
				p, err := newSemaphore(t, cluster.Client(t), name, limit).Acquire(ctx)
				require.NoError(t, err)
				holders[i] = p
			}
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			for i := range waiters {
				s := newSemaphore(t, cluster.Client(t), name, limit)
				wg.Go(func() {
					p, err := s.Acquire(ctx)
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					assert.NoError(t, p.Release(ctx))
				})
				awaitPermits(t, admin, name, int64(limit+i+1)) // waiter i is in line before i+1 starts
			}
			// One permit frees: the waiters pass through it one by one, in line, while the
			// other holders keep theirs.
			require.NoError(t, holders[0].Release(ctx))
			wg.Wait()
			assert.Equal(t, []int{0, 1, 2, 3, 4}, order)
			for _, p := range holders[1:] {
				require.NoError(t, p.Release(ctx))
			}
			assert.Zero(t, permitsOf(t, admin, name))
		})
	}
}

func TestTryAcquireWhenFullFailsAndWritesNothing(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			ctx := testContext(t)
			name := fmt.Sprintf("try-%d", limit)
			admin := cluster.Client(t)
			s := newSemaphore(t, cluster.Client(t), name, limit)
			var held []*semaphore.Permit
			for range limit {
				p, err := s.TryAcquire(ctx)
				require.NoError(t, err, "a free permit")
				held = append(held, p)
			}
			other := newSemaphore(t, cluster.Client(t), name, limit)
			_, err := other.Acquire(testTimeout(t, time.Millisecond)) // records nothing new: the limit is there
			require.Error(t, err)

			before := etcdtest.Revision(t, admin)
			for range 3 {
				p, err := other.TryAcquire(ctx)
				assert.ErrorIs(t, err, semaphore.ErrNoPermits)
				assert.Nil(t, p)
			}
			etcdtest.NoWrites(t, admin, before, "a failed TryAcquire wrote")
			assert.Equal(t, int64(limit), permitsOf(t, admin, name))

			// A waiter in line: a permit that frees is its, not a try's.
			waiter := acquireAsync(ctx, other)
			awaitPermits(t, admin, name, int64(limit+1))
			require.NoError(t, held[0].Release(ctx))
			w := etcdtest.Within(t, waiter, 10*time.Second, "the waiter is served")
			require.NoError(t, w.err)
			_, err = s.TryAcquire(ctx)
			assert.ErrorIs(t, err, semaphore.ErrNoPermits)
			for _, p := range append(held[1:], w.p) {
				require.NoError(t, p.Release(ctx))
			}
			assert.Zero(t, permitsOf(t, admin, name))
		})
	}
}

// testTimeout is a context that ends after d.
func testTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestAHandleFollowsTheRecordedLimit: the first user records its limit (with its marker);
// a handle made with another follows etcd's; units above etcd's limit are refused having
// written nothing; after an operator deleted the record, the next user records its own and
// a handle that knew the old one follows it.
func TestAHandleFollowsTheRecordedLimit(t *testing.T) {
	ctx := testContext(t)
	const name = "follows"
	admin := cluster.Client(t)
	_, err := admin.Delete(ctx, core.NamePrefix(name)+"limit", clientv3.WithPrefix()) // the record outlives a run of -count
	require.NoError(t, err)
	first := newSemaphore(t, cluster.Client(t), name, 3)
	p, err := first.Acquire(ctx)
	require.NoError(t, err)
	resp, err := admin.Get(ctx, core.NamePrefix(name)+"limit", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 2, "the limit and its marker are recorded")
	assert.Equal(t, "3", string(resp.Kvs[0].Value))
	assert.Equal(t, core.NamePrefix(name)+"limit/3", string(resp.Kvs[1].Key))
	for _, kv := range resp.Kvs {
		assert.Zero(t, kv.Lease, "the limit's keys have a lease")
	}

	lower := newSemaphore(t, cluster.Client(t), name, 2)
	p2, err := lower.AcquireN(ctx, 2)
	require.NoError(t, err, "a handle made with a lower limit follows etcd's")
	assert.Equal(t, 3, lower.Limit())
	higher := newSemaphore(t, cluster.Client(t), name, 5)
	before := etcdtest.Revision(t, admin)
	_, err = higher.AcquireN(ctx, 4)
	assert.ErrorIs(t, err, semaphore.ErrInvalidOption)
	_, err = lower.TryAcquireN(ctx, 4)
	assert.ErrorIs(t, err, semaphore.ErrInvalidOption)
	etcdtest.NoWrites(t, admin, before, "units over etcd's limit wrote")
	assert.Equal(t, 3, higher.Limit())
	require.NoError(t, p.Release(ctx))
	require.NoError(t, p2.Release(ctx))

	// An operator resets the limit while no permit is held: the next user records its own,
	// and a handle that knew the old one finds it changed by the guard in its acquiring Txn.
	_, err = admin.Delete(ctx, core.NamePrefix(name)+"limit", clientv3.WithPrefix())
	require.NoError(t, err)
	other := newSemaphore(t, cluster.Client(t), name, 2)
	p, err = other.Acquire(ctx)
	require.NoError(t, err)
	p2, err = first.Acquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, first.Limit())
	_, err = first.TryAcquire(ctx)
	assert.ErrorIs(t, err, semaphore.ErrNoPermits)
	require.NoError(t, p.Release(ctx))
	require.NoError(t, p2.Release(ctx))
	assert.Zero(t, permitsOf(t, admin, name))
}

func TestARevokedHoldersPermitIsFreedAndReportedLost(t *testing.T) {
	ctx := testContext(t)
	const name = "revoked"
	admin := cluster.Client(t)
	holder := newSemaphore(t, cluster.Client(t), name, 2)
	dead, err := holder.Acquire(ctx)
	require.NoError(t, err)
	other, err := holder.Acquire(ctx) // the same client: the same lease, revoked with it
	require.NoError(t, err)
	done := dead.Done()
	assert.NoError(t, dead.Err())

	waiter := newSemaphore(t, cluster.Client(t), name, 2)
	w := acquireAsync(ctx, waiter)
	awaitPermits(t, admin, name, 3)
	resp, err := admin.Get(ctx, permitPrefix(name), clientv3.WithFirstCreate()...)
	require.NoError(t, err)
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)

	etcdtest.Within(t, done, 3*time.Second, "Done closes after the lease is revoked")
	assert.ErrorIs(t, dead.Err(), semaphore.ErrLost)
	got := etcdtest.Within(t, w, 3*time.Second, "the waiter is served")
	require.NoError(t, got.err)
	assert.ErrorIs(t, dead.Release(ctx), semaphore.ErrLost)
	assert.ErrorIs(t, other.Release(ctx), semaphore.ErrLost)
	assert.Equal(t, int64(1), permitsOf(t, admin, name), "a lost permit's release touched another")

	// The revoked session is replaced for the next acquisition.
	again, err := holder.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, again.Release(ctx))
	require.NoError(t, got.p.Release(ctx))
	assert.Zero(t, permitsOf(t, admin, name))
}

func TestInUseCountsHoldersNotWaiters(t *testing.T) {
	ctx := testContext(t)
	const name, limit = "in-use", 3
	s := newSemaphore(t, cluster.Client(t), name, limit)
	n, err := s.InUse(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	var held []*semaphore.Permit
	for i := range limit {
		p, err := s.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, p)
		n, err := newSemaphore(t, cluster.Client(t), name, limit).InUse(ctx)
		require.NoError(t, err)
		assert.Equal(t, i+1, n)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w1, w2 := acquireAsync(wctx, s), acquireAsync(wctx, s)
	awaitPermits(t, cluster.Client(t), name, limit+2)
	n, err = s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, limit, n, "waiters counted as holders")
	cancel()
	for _, w := range []<-chan acquired{w1, w2} {
		assert.ErrorIs(t, etcdtest.Within(t, w, 10*time.Second, "cancelled waiter returns").err, context.Canceled)
	}
	for _, p := range held {
		require.NoError(t, p.Release(ctx))
	}
	n, err = s.InUse(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestReleaseTwiceReturnsNotLocked(t *testing.T) {
	ctx := testContext(t)
	s := newSemaphore(t, cluster.Client(t), "release-twice", 2)
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	token, done := p.Token(), p.Done()
	assert.Positive(t, token)
	require.NoError(t, p.Release(ctx))
	etcdtest.Within(t, done, time.Second, "Done after Release")
	assert.ErrorIs(t, p.Release(ctx), semaphore.ErrNotLocked)
	assert.ErrorIs(t, p.Err(), semaphore.ErrNotLocked)
	assert.Zero(t, p.Token())

	var none *semaphore.Permit
	assert.ErrorIs(t, none.Release(ctx), semaphore.ErrNotLocked)
	assert.ErrorIs(t, none.Err(), semaphore.ErrNotLocked)
	etcdtest.Within(t, none.Done(), time.Second, "a nil Permit's Done is closed")
}

// TestAServedWaiterSendsNoRPCAfterItsWakeUp: a contended Acquire costs its Txn and its
// watch; the release that serves it arrives as an event, and it reads nothing. The counts
// are the waiter's calls' own (labelled) and the client's requests on the name's keys, not
// what the client sends meanwhile for others (lease renewals, the read of its clock).
func TestAServedWaiterSendsNoRPCAfterItsWakeUp(t *testing.T) {
	ctx := testContext(t)
	const name = "no-rpc"
	cnt := &rpcstat.Counter{}
	cfg := cluster.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	cli, err := cluster.Open(cfg)
	require.NoError(t, err)
	defer cli.Close()
	onName := cluster.Prefix() + core.NamePrefix(name)
	cnt.Track(onName)
	s := newSemaphore(t, cli, name, 2)
	warm, err := s.Acquire(ctx) // grants the lease and records the limit
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	admin := cluster.Client(t)
	other := newSemaphore(t, admin, name, 2)
	b, err := other.Acquire(ctx)
	require.NoError(t, err)
	// Two rounds: the first opens cli's watch of the name (and may read once, if revisions
	// moved between its Txn and the watch's start); the second finds the watch in place.
	for round := range 2 {
		a, err := other.Acquire(ctx)
		require.NoError(t, err)
		before, beforeOnName := cnt.Labelled("waiter"), cnt.Under(onName)
		w := acquireAsync(rpcstat.WithLabel(ctx, "waiter"), s)
		awaitPermits(t, admin, name, 3)
		require.NoError(t, a.Release(ctx))
		got := etcdtest.Within(t, w, 10*time.Second, "the waiter is served")
		require.NoError(t, got.err)
		if round == 1 {
			assert.Equal(t, rpcstat.Counts{"Txn": 1}, cnt.Labelled("waiter").Sub(before), "RPCs of a contended Acquire on a client that watches the name")
			assert.Equal(t, rpcstat.Counts{"Txn": 1}, cnt.Under(onName).Sub(beforeOnName), "requests on the name's keys of a contended Acquire on a client that watches the name")
		}
		require.NoError(t, got.p.Release(ctx))
	}
	require.NoError(t, b.Release(ctx))
}

// TestABadLimitIsRejectedAndWritesNothing: New refuses a limit below 1, or one whose units
// could overflow what a waiter sums (a limit of 2^63-1 once let three permits of 5e18
// units hold at once). (Bad names and options of every package: primtest's
// TestBadInputIsRejectedAndWritesNothing.)
func TestABadLimitIsRejectedAndWritesNothing(t *testing.T) {
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	for _, limit := range []int{0, -3, semaphore.MaxLimit + 1, math.MaxInt} {
		s, err := semaphore.New(cli, "ok", limit)
		assert.ErrorIs(t, err, semaphore.ErrInvalidOption, "limit %d", limit)
		assert.Nil(t, s)
	}
	etcdtest.NoWrites(t, cli, before, "bad input wrote to etcd")
}

func TestNestedNamesAreIndependent(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	names := []string{"n", "n/permit", "n/limit", "np", "n/"}
	var held []*semaphore.Permit
	for i, name := range names {
		p, err := newSemaphore(t, cli, name, 1+i).TryAcquire(ctx)
		require.NoError(t, err, "name %q blocked or refused by another", name)
		held = append(held, p)
	}
	for i, p := range held {
		assert.Equal(t, int64(1), permitsOf(t, cli, names[i]), "name %q sees another's key", names[i])
		require.NoError(t, p.Release(ctx))
	}
}

// TestInUseRidesOutAMemberStopping: InUse's read (a Txn of the limit and the permits), refused twice with what a stopping member
// says ("raft: stopped", which etcd's client does not retry), is retried until it is
// answered, as election's Leader is, instead of failing.
func TestInUseRidesOutAMemberStopping(t *testing.T) {
	ctx := testContext(t)
	const name, limit = "in-use-member-stopping", 2
	inj := &etcdtest.Injector{}
	s := newSemaphore(t, inj.Client(t, cluster), name, limit)
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	refused := make(chan struct{}, 2)
	inj.Add(etcdtest.Rule{Method: "Txn", Action: etcdtest.Refuse, Err: status.Error(codes.Unknown, "raft: stopped"), Times: 2,
		Matched: func() { refused <- struct{}{} }})
	n, err := s.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Len(t, refused, 2, "the refusals were not met")
	require.NoError(t, p.Release(ctx))
}
