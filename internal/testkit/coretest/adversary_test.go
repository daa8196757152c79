package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// The tests here play the adversary the fault harness does not: several deletes at one
// revision, answers that come late or never, a session that ends while work is in flight,
// a client cut off beside healthy ones. Each pins down one way the core once broke.

// acquire runs q.Acquire in a goroutine: the hold or the error arrives on the channel.
type result struct {
	h   *core.Hold
	err error
}

func acquireResult(ctx context.Context, q *core.Queue, spec core.Spec) <-chan result {
	out := make(chan result, 1)
	go func() {
		h, err := q.Acquire(ctx, spec, nil)
		out <- result{h, err}
	}()
	return out
}

func release(t *testing.T, h *core.Hold) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := h.Release(ctx)
	require.NoError(t, err)
}

// TestALeaseEndingTakesItsOwnWaiterWithItsHolder: client A holds and has a waiter behind
// itself; client B waits behind both. A's lease ends (revoked, or Shutdown): both of A's keys
// go at one revision. A's waiter must not count its holder's delete and be served on a key
// that went with it: it fails with ErrLost, and only B is served.
func TestALeaseEndingTakesItsOwnWaiterWithItsHolder(t *testing.T) {
	permit := core.Spec{Kind: core.KindPermit, Ahead: core.KindPermit}
	for _, tc := range []struct {
		name string
		spec core.Spec
		end  func(ctx context.Context, a, admin *clientv3.Client, lease clientv3.LeaseID) error
	}{
		{"revoked", exclusive, revokeLease},
		{"shutdown", exclusive, func(ctx context.Context, a, _ *clientv3.Client, _ clientv3.LeaseID) error {
			return core.Shutdown(ctx, a)
		}},
		{"permit revoked", permit, revokeLease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 5 {
				ctx := testContext(t)
				name := "own-waiter-" + tc.name
				a, b, admin := cluster.Client(t), cluster.Client(t), cluster.Client(t)
				qa, qb := queue(t, a, name), queue(t, b, name)
				holder, err := qa.Acquire(ctx, tc.spec, nil)
				require.NoError(t, err)
				own := acquireResult(ctx, qa, tc.spec)
				awaitCount(t, admin, name, 2)
				other := acquireResult(ctx, qb, tc.spec)
				awaitCount(t, admin, name, 3)

				require.NoError(t, tc.end(ctx, a, admin, leaseOf(t, admin, holder.Key())))
				got := etcdtest.Within(t, own, 10*time.Second, "A's own waiter")
				assert.ErrorIs(t, got.err, core.ErrLost, "round %d: A's waiter was served on a key that went with its lease", i)
				if got.h != nil {
					release(t, got.h)
				}
				served := etcdtest.Within(t, other, 10*time.Second, "B's waiter")
				require.NoError(t, served.err, "round %d", i)
				release(t, served.h)
				_, _ = holder.Release(ctx)
			}
		})
	}
}

// deletesUnder matches a Txn or a DeleteRange that deletes a key under prefix.
func deletesUnder(prefix string) func(any) bool {
	txn := etcdtest.TxnDeletesUnder(prefix)
	return func(req any) bool {
		if d, ok := req.(*etcdserverpb.DeleteRangeRequest); ok {
			return strings.HasPrefix(string(d.Key), prefix)
		}
		return txn(req)
	}
}

func revokeLease(ctx context.Context, _, admin *clientv3.Client, lease clientv3.LeaseID) error {
	_, err := admin.Revoke(ctx, lease)
	return err
}

// TestAnOperatorsRangeDeleteServesNoWaiterOnAGoneKey: `etcdctl del --prefix NAME/` deletes
// the holder's key and a waiter's (other clients, other leases) at one revision: the waiter
// is not served on its gone key.
func TestAnOperatorsRangeDeleteServesNoWaiterOnAGoneKey(t *testing.T) {
	for i := range 5 {
		ctx := testContext(t)
		const name = "range-delete"
		admin := cluster.Client(t)
		holder, err := queue(t, cluster.Client(t), name).Acquire(ctx, exclusive, nil)
		require.NoError(t, err)
		waiter := acquireResult(ctx, queue(t, cluster.Client(t), name), exclusive)
		awaitCount(t, admin, name, 2)
		_, err = admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
		require.NoError(t, err)
		got := etcdtest.Within(t, waiter, 10*time.Second, "the waiter")
		assert.ErrorIs(t, got.err, core.ErrLost, "round %d: served on a deleted key", i)
		_, err = holder.Release(ctx)
		assert.ErrorIs(t, err, core.ErrLost)
	}
}

// TestACancelledWaiterCutOffFromEtcdLeavesNoKeyOnceItHeals: a waiter cancelled while its
// client is cut off cannot delete its key; the key must go once etcd answers again, though
// the client's lease lives on (another hold keeps it renewed), instead of blocking the name
// for the client's lifetime.
func TestACancelledWaiterCutOffFromEtcdLeavesNoKeyOnceItHeals(t *testing.T) {
	ctx := testContext(t)
	const name = "cut-cancel"
	admin := cluster.Client(t)
	cli, proxy := etcdtest.ProxiedClient(t, cluster, 0)
	long := core.WithTTL(15 * time.Second)
	holder, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	keeper, err := queue(t, cli, name+"-keeper", long).Acquire(ctx, exclusive, nil) // keeps the lease in use
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx)
	waiter := acquireResult(wctx, queue(t, cli, name, long), exclusive)
	awaitCount(t, admin, name, 2)
	// Pause, not Blackhole: a partition loses no bytes of a TCP connection, and one garbled
	// by Blackhole can keep the client from renewing its lease for longer than the keeper's
	// TTL (seen against three 3.4.23 members: the keeper's key expired).
	proxy.Pause()
	cancel()
	got := etcdtest.Within(t, waiter, 10*time.Second, "the cancelled waiter")
	require.ErrorIs(t, got.err, context.Canceled)
	assert.EqualValues(t, 2, etcdtest.CountKeys(t, admin, core.NamePrefix(name)), "the cut-off waiter's key is still there")
	proxy.Resume()

	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 1) // fails after 20 s
	ttl, err := admin.TimeToLive(ctx, leaseOf(t, admin, keeper.Key()))
	require.NoError(t, err)
	assert.Positive(t, ttl.TTL, "the client's lease lives on")
	release(t, holder)
	release(t, keeper)
}

// TestALateCleanupDeleteNeverTakesTheNextHoldsKey: a cancelled waiter's cleanup delete gets
// no answer but etcd applies it later; meanwhile the next Lock of the same client and name
// is served, on the same slot's key. The late delete must not free that holder's key (it is
// fenced on the create revision), so nobody else is served while it holds.
func TestALateCleanupDeleteNeverTakesTheNextHoldsKey(t *testing.T) {
	ctx := testContext(t)
	const name = "late-delete"
	admin := cluster.Client(t)
	inj := &etcdtest.Injector{}
	cli := inj.Client(t, cluster)
	q := queue(t, cli, name)
	holder, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx)
	first := acquireResult(wctx, q, exclusive)
	awaitCount(t, admin, name, 2)
	for _, method := range []string{"Txn", "DeleteRange"} { // a fenced delete, or a bare one
		inj.Add(etcdtest.Rule{Method: method, Match: deletesUnder(core.NamePrefix(name)), Action: etcdtest.Late, Delay: 3 * time.Second, Times: 1})
	}
	cancel()
	require.ErrorIs(t, etcdtest.Within(t, first, 10*time.Second, "the cancelled waiter").err, context.Canceled)

	next := acquireResult(ctx, q, exclusive)
	awaitCount(t, admin, name, 2)
	release(t, holder)
	got := etcdtest.Within(t, next, 10*time.Second, "the next Lock")
	require.NoError(t, got.err)

	inj.Settle() // the late delete has landed
	other, err := queue(t, admin, name).TryAcquire(ctx, exclusive)
	if err == nil {
		release(t, other)
	}
	assert.ErrorIs(t, err, core.ErrLocked, "another client got the lock while the next holder holds")
	assert.True(t, got.h.Live())
	release(t, got.h)
}

// TestATakenOverKeyGetsTheNewValue: a key already at an acquisition's slot (written by a
// try whose answer was lost) is taken over with the new acquisition's value, not kept with
// an older one (a stale election proposal, another owner).
func TestATakenOverKeyGetsTheNewValue(t *testing.T) {
	ctx := testContext(t)
	const name = "take-over"
	admin, cli := cluster.Client(t), cluster.Client(t)
	q := queue(t, cli, name)
	h, err := q.Acquire(ctx, core.Spec{Value: "first"}, nil)
	require.NoError(t, err)
	key, lease := h.Key(), leaseOf(t, admin, h.Key())
	release(t, h)
	// The same slot's key, on the same lease, with an old value: as if a put of an earlier
	// acquisition landed after its cleanup.
	_, err = admin.Put(ctx, key, "stale", clientv3.WithLease(lease))
	require.NoError(t, err)
	h, err = q.Acquire(ctx, core.Spec{Value: "fresh"}, nil)
	require.NoError(t, err)
	require.Equal(t, key, h.Key())
	resp, err := admin.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	assert.Equal(t, "fresh", string(resp.Kvs[0].Value))
	release(t, h)
}

// TestOneSlowTryDoesNotFailAnAcquisitionWithTimeLeft: a Txn whose answer never comes times
// out after its try's bound; the acquisition tries again (finding its key written) instead
// of failing while its ctx has time left.
func TestOneSlowTryDoesNotFailAnAcquisitionWithTimeLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out one try's 5 s bound")
	}
	ctx := testContext(t)
	const name = "slow-try"
	inj := &etcdtest.Injector{}
	q := queue(t, inj.Client(t, cluster), name)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Drop, Times: 1})
	h, err := q.Acquire(ctx, exclusive, nil)
	require.NoError(t, err, "one try without an answer failed the acquisition")
	assert.True(t, h.Live())
	release(t, h)
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), core.NamePrefix(name)))
}

// TestAFailedReleaseIsNeverCreditedWithALaterDelete: a release refused by etcd leaves the
// hold held; when an operator then deletes the key, that is a loss (Done closes, Err says
// ErrLost, the next Release too), never taken for the failed release's own delete.
func TestAFailedReleaseIsNeverCreditedWithALaterDelete(t *testing.T) {
	ctx := testContext(t)
	const name = "failed-release"
	admin := cluster.Client(t)
	inj := &etcdtest.Injector{}
	q := queue(t, inj.Client(t, cluster), name)
	h, err := q.Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	done := h.Done()

	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.NamePrefix(name)), Action: etcdtest.Refuse, Times: 1})
	ended, err := h.Release(ctx)
	require.Error(t, err)
	require.False(t, ended, "a refused release ended the hold")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	ended, err = h.Release(cctx) // with its ctx done: sends nothing
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ended)
	require.True(t, h.Live())

	_, err = admin.Delete(ctx, h.Key())
	require.NoError(t, err)
	etcdtest.Within(t, done, 10*time.Second, "Done after the key was deleted")
	assert.ErrorIs(t, h.Err(), core.ErrLost)
	ended, err = h.Release(ctx)
	assert.True(t, ended)
	assert.ErrorIs(t, err, core.ErrLost, "a loss reported as a release")
}

// TestAnAcquisitionWhoseSessionEndedIsNoHold: the session's renewals stop getting through
// and its local deadline passes while the acquiring Txn is held back; etcd still has the
// lease (kept alive elsewhere, as a new leader that extended it would), so the Txn is
// applied. The acquisition must not return a hold on a session that ended: it says ErrLost
// and removes its key.
func TestAnAcquisitionWhoseSessionEndedIsNoHold(t *testing.T) {
	ctx := testContext(t)
	const name = "ended-session"
	admin := cluster.Client(t)
	inj := &etcdtest.Injector{}
	cli := inj.Client(t, cluster)
	short := core.WithTTL(2 * time.Second)
	warm, err := queue(t, cli, name+"-warm", short).Acquire(ctx, exclusive, nil) // the session, granted
	require.NoError(t, err)
	lease := leaseOf(t, admin, warm.Key())
	keep, err := admin.KeepAlive(ctx, lease) // etcd keeps the lease whatever this client does
	require.NoError(t, err)
	go func() {
		for range keep {
		}
	}()
	inj.Add(etcdtest.Rule{Method: "LeaseKeepAlive", Action: etcdtest.Lose})
	inj.Add(etcdtest.Rule{Method: "LeaseRevoke", Action: etcdtest.Refuse, Err: status.Error(codes.Unavailable, "injected")})
	// The Txn goes out once the session has ended.
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Hold, Until: warm.Done(), Times: 1})

	_, err = queue(t, cli, name, short).Acquire(ctx, exclusive, nil)
	assert.ErrorIs(t, err, core.ErrLost, "a hold on a session that had ended")
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 0)
	_, _ = admin.Revoke(ctx, lease)
}

// TestShutdownEndsAnAcquisitionUnderWay: an acquisition whose Txn is in flight when Shutdown
// revokes the lease it was built with fails with ErrLost; it does not move to a new lease
// and leave a key that outlives the client's Close.
func TestShutdownEndsAnAcquisitionUnderWay(t *testing.T) {
	ctx := testContext(t)
	const name = "shutdown-race"
	admin := cluster.Client(t)
	inj := &etcdtest.Injector{}
	cli := inj.Client(t, cluster)
	warm, err := queue(t, cli, name+"-warm").Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	inFlight, shut := make(chan struct{}), make(chan struct{})
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Hold, Until: shut,
		Matched: func() { close(inFlight) }, Times: 1})
	got := acquireResult(ctx, queue(t, cli, name), exclusive)
	etcdtest.Within(t, inFlight, 5*time.Second, "the acquisition's Txn")
	require.NoError(t, core.Shutdown(ctx, cli))
	close(shut)
	res := etcdtest.Within(t, got, 10*time.Second, "the acquisition under way")
	assert.ErrorIs(t, res.err, core.ErrLost)
	if res.h != nil {
		release(t, res.h)
	}
	assert.Zero(t, etcdtest.CountKeys(t, admin, core.NamePrefix(name)))
	_, err = warm.Release(ctx)
	assert.ErrorIs(t, err, core.ErrLost)
}

// TestACutOffClientStallsNoOtherWaiter: registrations on a name of a client cut off from
// etcd (release watches, as trylock.Retry makes, two at once) must not hold up a waiter of
// a healthy client on another name, nor its return on its own ctx.
func TestACutOffClientStallsNoOtherWaiter(t *testing.T) {
	ctx := testContext(t)
	cut, proxy := etcdtest.ProxiedClient(t, cluster, 0)
	_, err := cut.Get(ctx, "warm") // connected before the cut
	require.NoError(t, err)
	proxy.Blackhole()
	defer proxy.Restore()
	cq := queue(t, cut, "cut-name")
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			r := cq.WatchReleases("")
			r.Arm()
			r.Stop()
		})
	}
	registered := make(chan struct{})
	go func() { wg.Wait(); close(registered) }()
	etcdtest.Within(t, registered, 5*time.Second, "registrations on the cut-off client's name")

	healthy := cluster.Client(t)
	holder, err := queue(t, healthy, "healthy-name").Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	gaveUp := acquireResult(wctx, queue(t, cluster.Client(t), "healthy-name"), exclusive)
	waiter := acquireResult(ctx, queue(t, cluster.Client(t), "healthy-name"), exclusive)
	awaitCount(t, healthy, "healthy-name", 3)
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, gaveUp, 5*time.Second, "a healthy waiter on its own ctx").err, context.Canceled)
	release(t, holder)
	got := etcdtest.Within(t, waiter, 5*time.Second, "a healthy waiter")
	require.NoError(t, got.err)
	release(t, got.h)
}

// TestTransientErrors: what etcd and gRPC say when a member stops or restarts under a
// request is transient, so the request is sent again.
func TestTransientErrors(t *testing.T) {
	for _, err := range []error{
		status.Error(codes.Unknown, "raft: stopped"),
		status.Error(codes.Unknown, "unexpected HTTP status code received from server: 200 (OK); malformed header: missing HTTP content-type"),
		status.Error(codes.Unavailable, "etcdserver: no leader"),
		status.Error(codes.InvalidArgument, `invalid gRPC request content-type ""`),
	} {
		assert.True(t, core.Transient(err), "%v", err)
	}
	for _, err := range []error{
		status.Error(codes.Unknown, "something else"),
		status.Error(codes.PermissionDenied, "etcdserver: permission denied"),
		status.Error(codes.InvalidArgument, "etcdserver: key is not provided"),
		errors.New("plain"),
	} {
		assert.False(t, core.Transient(err), "%v", err)
	}
}

// TestTwoRenewalsWithoutAnswerCostNoHold: two renewals in a row reach a member that holds
// them without an answer (a follower cut off from its leader, before it notices). Each try
// is bounded well within the lease's margin and the next goes out at once, so the hold
// outlives them, even with a 2 s TTL.
func TestTwoRenewalsWithoutAnswerCostNoHold(t *testing.T) {
	ctx := testContext(t)
	const name = "silent-renewals"
	inj := &etcdtest.Injector{}
	cli := inj.Client(t, cluster)
	h, err := queue(t, cli, name, core.WithTTL(2*time.Second)).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	done := h.Done()
	matched := make(chan struct{}, 2)
	inj.Add(etcdtest.Rule{Method: "LeaseKeepAlive", Action: etcdtest.Lose, Times: 2, Matched: func() { matched <- struct{}{} }})
	for range 2 {
		etcdtest.Within(t, matched, 5*time.Second, "a renewal that gets no answer")
	}
	select {
	case <-done:
		t.Fatalf("the hold was lost after two renewals without an answer: %v", h.Err())
	case <-time.After(4 * time.Second): // two TTLs: renewals after the silent ones went through
	}
	release(t, h)
}

// TestAHoldIsToldAtItsDeadlineWhileItsWatchIsRefused: in an outage a member without a
// leader refuses the hold's watch at once, so its monitor spends most of its time pausing
// between watches. When no renewal gets through, the session's local deadline must end the
// hold (Done closed, Err ErrLost naming the deadline) whether it falls in a watch or in a
// pause: a pause cut short by the session's end once returned quietly, and Done stayed open
// for good. Three holds in a row, so that a deadline falls in a pause.
func TestAHoldIsToldAtItsDeadlineWhileItsWatchIsRefused(t *testing.T) {
	for i := range 3 {
		ctx := testContext(t)
		name := fmt.Sprintf("refused-watch-%d", i)
		inj := &etcdtest.Injector{}
		cli := inj.Client(t, cluster)
		q := queue(t, cli, name, core.WithTTL(2*time.Second))
		h, err := q.Acquire(ctx, exclusive, nil)
		require.NoError(t, err)
		noLeader := status.Error(codes.PermissionDenied, "etcdtest: injected: refused")
		inj.Add(etcdtest.Rule{Method: "Watch", Action: etcdtest.Refuse, Err: noLeader})
		inj.Add(etcdtest.Rule{Method: "LeaseKeepAlive", Action: etcdtest.Refuse})
		etcdtest.Within(t, h.Done(), 10*time.Second, "the hold's Done")
		assert.ErrorIs(t, h.Err(), core.ErrLost)
		assert.ErrorContains(t, h.Err(), "local deadline")
		assert.ErrorContains(t, h.Err(), "injected", "the loss does not say why the renewals failed")
		inj.Clear()
		_, err = h.Release(ctx)
		assert.ErrorIs(t, err, core.ErrLost)
		require.NoError(t, core.Shutdown(ctx, cli))
	}
}

// TestAHoldWhoseKeepAliveOrMonitorStopsIsLost: every goroutine a hold relies on either runs
// as long as the hold lives or ends the hold when it stops. A keep-alive that stops while
// nothing ended its session, and a monitor that returns while the hold is held, each end the
// hold as lost (Done closed, Err and Release ErrLost), so that Done never stays open with
// nothing left to close it.
func TestAHoldWhoseKeepAliveOrMonitorStopsIsLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*core.Hold)
		why  string
	}{
		{"keep-alive", core.StopKeepAlive, "keep-alive stopped"},
		{"monitor", core.StopMonitor, "watch of the hold's key and session stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			name := "stopped-" + tc.name
			cli := cluster.Client(t)
			q := queue(t, cli, name, core.WithTTL(2*time.Second))
			h, err := q.Acquire(ctx, exclusive, nil)
			require.NoError(t, err)
			done := h.Done()
			tc.stop(h)
			etcdtest.Within(t, done, 5*time.Second, "the hold's Done")
			assert.ErrorIs(t, h.Err(), core.ErrLost)
			assert.ErrorContains(t, h.Err(), tc.why)
			_, err = h.Release(ctx)
			assert.ErrorIs(t, err, core.ErrLost)
			require.NoError(t, core.Shutdown(ctx, cli))
			etcdtest.AwaitKeys(t, cluster.Client(t), core.NamePrefix(name), 0)
		})
	}
}
