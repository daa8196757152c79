package faulttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// progressDuring is how many waiters a fault that leaves a quorum must see served before it
// heals: it lasts that long.
const progressDuring = 10

// Fault disturbs the cluster or one client while a workload runs.
type Fault struct {
	Name string
	// Inject disturbs, lets the workload run into the disturbance, heals it and returns the
	// time, on the run's history clock, from which the cluster is whole again. It fails t
	// for what it saw go wrong meanwhile, and stops the test if it cannot heal.
	Inject func(ctx context.Context, t testing.TB, r *Run) (healed time.Duration)
	// Pair, if not 0, makes it one of two faults that disturb the core every primitive shares
	// alike: Suite runs the one of Pair 1 for a workload of an odd Seed, the one of Pair 2 for
	// an even one, and both in a soak, so that CI meets both within its time.
	Pair int
}

// Faults returns every fault, each healed before it returns, so that one Env serves them
// all in turn.
func Faults() []Fault {
	return []Fault{
		{"leader stopped", leaderDown((*etcdtest.Cluster).Stop), 1},
		{"leader killed", leaderDown((*etcdtest.Cluster).Kill), 2},
		{"leader partitioned", partitioned(leaderOf), 0},
		{"holder's member partitioned", partitioned(memberOf), 0},
		{"holder paused", holderPaused, 0},
		{"holder's lease revoked", leaseRevoked, 0},
		{"compaction while waiting", compacted, 0},
		{"holder's key deleted after a compaction and a reconnect", deletedAfterCompaction, 0},
		{"cluster restarted", clusterRestarted, 0},
		{"majority stopped for two TTLs", majorityDown((*etcdtest.Cluster).Stop, 2), 1},
		{"majority killed for half a TTL", majorityDown((*etcdtest.Cluster).Kill, 0.5), 2},
	}
}

// AuthFaults returns the faults that need an Env with auth (NewAuthEnv), each healed before
// it returns. None stops a member (see NewAuthEnv).
func AuthFaults() []Fault {
	return []Fault{
		{"a hold's key deleted after an auth change", deletedAfterAuthChange, 0},
	}
}

// majorityDown stops the leader and one other member during a hold (gracefully, so the
// leader hands over first, or killed) for ttls TTLs, then starts both again. The member left
// has no leader: nothing is served and no renewal gets through. A struck holder of an
// exclusive primitive cut off for longer than its TTL must know it lost (its Done closed)
// by the time another worker is seen served after the restart, and its hold must end as
// lost; one cut off for less may keep its hold.
func majorityDown(stop func(*etcdtest.Cluster, int), ttls float64) func(context.Context, testing.TB, *Run) time.Duration {
	return func(ctx context.Context, t testing.TB, r *Run) time.Duration {
		var down []int
		var told atomic.Int64 // when the struck hold's Done closed, on the history clock; 0 if not
		watched := false      // the workload's locks have a Done
		h := r.strikeHold(ctx, t, func(h held) error {
			// The struck hold's own Done, taken now: the worker may hold again later.
			if d, ok := h.wk.lk.(interface{ Done() <-chan struct{} }); ok {
				watched = true
				done := d.Done()
				go func() {
					select {
					case <-done:
						told.Store(int64(r.hist.Now()))
					case <-ctx.Done():
					}
				}()
			}
			leader, err := r.env.leader(ctx)
			if err != nil {
				return err
			}
			down = []int{leader, (leader + 1) % r.env.Cluster.Size()}
			for _, i := range down {
				stop(r.env.Cluster, i)
			}
			return nil
		})
		outage := time.Duration(ttls * float64(r.w.TTL))
		select {
		case <-time.After(outage):
		case <-ctx.Done():
		}
		// Together: a member that restarts alone waits for a peer to form a quorum with.
		if err := r.env.Cluster.RestartAll(down...); err != nil {
			t.Fatalf("faulttest: %v", err)
		}
		r.leader(ctx, t)
		back := r.hist.Now()
		t.Logf("members %v were down for %v (the holder: worker %d, token %d)", down, outage, h.wk.id, h.token)
		wctx, cancel := context.WithTimeout(ctx, r.w.serveBound())
		defer cancel()
		served, err := r.hist.awaitAcquires(wctx, 1, back, h.wk.id)
		switch {
		case err != nil:
			t.Errorf("nobody was served after the majority came back: %v", err)
		case watched && r.w.slots() == 1 && outage > r.w.TTL:
			if at := time.Duration(told.Load()); at == 0 || at > served {
				t.Errorf("another worker was served at %v, after the outage, while the holder (worker %d, token %d) still believed it held (told at %v)", served, h.wk.id, h.token, at)
			}
		}
		if outage > r.w.TTL {
			r.awaitLostHold(ctx, t, h, "cut-off")
		}
		return back
	}
}

// held is a hold a fault struck: the worker and its token.
type held struct {
	wk    *worker
	token int64
}

// leaderDown stops the leader (gracefully or killed) during a hold, waits for the others to
// serve waiters without it, and restarts it on its data.
func leaderDown(stop func(*etcdtest.Cluster, int)) func(context.Context, testing.TB, *Run) time.Duration {
	return func(ctx context.Context, t testing.TB, r *Run) time.Duration {
		leader := -1
		r.strikeHold(ctx, t, func(held) (err error) {
			if leader, err = r.env.leader(ctx); err == nil {
				stop(r.env.Cluster, leader)
			}
			return err
		})
		r.progress(ctx, t, "without the leader")
		if err := r.env.Cluster.Restart(leader); err != nil {
			t.Fatalf("faulttest: restart member %d: %v", leader, err)
		}
		r.leader(ctx, t)
		return r.hist.Now()
	}
}

// leaderOf and memberOf pick the member to partition during hold h: the leader, or the
// member the holder's client talks to (first, for a client balanced over all members).
func leaderOf(ctx context.Context, r *Run, _ held) (int, error) { return r.env.leader(ctx) }

func memberOf(_ context.Context, _ *Run, h held) (int, error) { return h.wk.cli.Member, nil }

// partitioned cuts a member off from its peers during a hold, waits for the majority to
// serve waiters without it (holders on it lose their leases, their writes get no answer),
// and heals.
func partitioned(pick func(context.Context, *Run, held) (int, error)) func(context.Context, testing.TB, *Run) time.Duration {
	return func(ctx context.Context, t testing.TB, r *Run) time.Duration {
		member := -1
		r.strikeHold(ctx, t, func(h held) (err error) {
			if member, err = pick(ctx, r, h); err == nil {
				r.env.Cluster.Partition(member)
			}
			return err
		})
		r.progress(ctx, t, fmt.Sprintf("with member %d partitioned", member))
		r.env.Cluster.Heal(member)
		r.leader(ctx, t)
		return r.hist.Now()
	}
}

// holderPaused black-holes a holder's client in the middle of a fenced write, so that it
// stops renewing its lease; once another worker is served (the lease expired) it restores the
// traffic. The paused holder's hold must then end without a clean release.
func holderPaused(ctx context.Context, t testing.TB, r *Run) time.Duration {
	h := r.strikeHold(ctx, t, func(h held) error {
		h.wk.cli.Blackhole()
		return nil
	})
	paused := r.hist.Now()
	wctx, cancel := context.WithTimeout(ctx, r.w.serveBound())
	_, err := r.hist.awaitAcquires(wctx, 1, paused, h.wk.id)
	if err != nil {
		t.Errorf("nobody was served while the holder (worker %d, token %d) was paused: %v", h.wk.id, h.token, err)
	}
	if d, ok := h.wk.lk.(interface{ Done() <-chan struct{} }); ok && err == nil && r.w.slots() == 1 {
		// Its session ends at a local deadline before etcd can let its lease expire: by the
		// time another worker is seen served, the paused holder knows it lost.
		select {
		case <-d.Done():
		default:
			t.Errorf("another worker was served while the paused holder (worker %d, token %d) still believed it held", h.wk.id, h.token)
		}
	}
	if err == nil && r.w.slots() > 1 {
		// With several slots others are served beside the paused holder, its lease still
		// alive: only its key's going says the lease expired.
		if err := r.awaitKeyGone(wctx, h.token); err != nil {
			t.Errorf("the paused holder's key (worker %d, token %d) did not go: %v", h.wk.id, h.token, err)
		}
	}
	cancel()
	h.wk.cli.Restore()
	healed := r.hist.Now()
	t.Logf("the paused holder (worker %d) was cut off for %v", h.wk.id, (healed - paused).Round(time.Millisecond))
	r.awaitLostHold(ctx, t, h, "paused")
	return healed
}

// awaitKeyGone returns once the key created at token under the lock's prefix is gone,
// woken by a watch rather than polling.
func (r *Run) awaitKeyGone(ctx context.Context, token int64) error {
	for {
		resp, err := r.env.Admin.Get(ctx, r.w.Prefix(r.name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return err
		}
		key := ""
		for _, kv := range resp.Kvs {
			if kv.CreateRevision == token {
				key = string(kv.Key)
			}
		}
		if key == "" {
			return nil
		}
		if gone, err := r.watchDelete(ctx, key, resp.Header.Revision+1); gone || !errors.Is(err, rpctypes.ErrCompacted) {
			return err // else the background writer compacted past rev: read again
		}
	}
}

// watchDelete reports whether key is deleted at or after rev, watching until ctx ends.
func (r *Run) watchDelete(ctx context.Context, key string, rev int64) (bool, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for wr := range r.env.Admin.Watch(wctx, key, clientv3.WithRev(rev), clientv3.WithFilterPut()) {
		if wr.Err() != nil {
			return false, wr.Err()
		}
		if len(wr.Events) > 0 {
			return true, nil
		}
	}
	return false, ctx.Err()
}

// leaseRevoked revokes a holder's lease in the middle of a fenced write: the next waiter is
// served at once, and the revoked hold must end without a clean release.
func leaseRevoked(ctx context.Context, t testing.TB, r *Run) time.Duration {
	h := r.strikeHold(ctx, t, func(h held) error {
		resp, err := r.env.Admin.Get(ctx, r.w.Prefix(r.name), clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("find the holder's lease: %w", err)
		}
		for _, kv := range resp.Kvs {
			if kv.CreateRevision == h.token {
				if _, err := r.env.Admin.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
					return fmt.Errorf("revoke lease %x: %w", kv.Lease, err)
				}
				return nil
			}
		}
		return fmt.Errorf("%w: no key of token %d under %q", errHoldGone, h.token, r.w.Prefix(r.name))
	})
	revoked := r.hist.Now()
	r.awaitLostHold(ctx, t, h, "revoked")
	return revoked
}

// compacted compacts the store to the current revision while waiters wait.
func compacted(ctx context.Context, t testing.TB, r *Run) time.Duration {
	for {
		resp, err := r.env.Admin.Get(ctx, r.w.Prefix(r.name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatalf("faulttest: read the keys: %v", err)
		}
		units := 0
		for _, kv := range resp.Kvs {
			units += r.w.keyUnits(string(kv.Key))
		}
		if units > r.w.slots() {
			if _, err := r.env.Admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
				t.Fatalf("faulttest: compact to %d: %v", resp.Header.Revision, err)
			}
			return r.hist.Now()
		}
		// Nobody waits now: try again after the next hand-off.
		if _, err := r.hist.awaitAcquires(ctx, 1, r.hist.Now(), -1); err != nil {
			t.Fatalf("faulttest: no waiters to compact under: %v", err)
		}
	}
}

// reconnectGrace is how long deletedAfterCompaction lets the clients of a restarted member
// reconnect before it deletes.
const reconnectGrace = 3 * time.Second

// deletedAfterCompaction compacts past a hold's token, physically, restarts the member of
// the holder's client, so that its watches are placed again from a compacted revision (or,
// for a holder that has not asked for Done yet, placed for the first time), and then
// deletes the held key, as an operator's `etcdctl del` would: the hold must be told (see
// awaitTold) and end without a clean release.
func deletedAfterCompaction(ctx context.Context, t testing.TB, r *Run) time.Duration {
	var deleted time.Duration
	h := r.strikeHold(ctx, t, func(h held) error {
		key, err := r.heldKey(ctx, h)
		if err != nil {
			return err
		}
		resp, err := r.env.Admin.Get(ctx, "\x00")
		if err != nil {
			return err
		}
		if _, err := r.env.Admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			return fmt.Errorf("compact to %d: %w", resp.Header.Revision, err)
		}
		r.env.Cluster.Stop(h.wk.cli.Member)
		if err := r.env.Cluster.Restart(h.wk.cli.Member); err != nil {
			return fmt.Errorf("restart member %d: %w", h.wk.cli.Member, err)
		}
		if _, err := r.env.leader(ctx); err != nil {
			return err
		}
		// The operator's delete comes later than the reconnect: by then the holder's
		// client has placed its watches again (it backs off up to a second between tries).
		r.wait(reconnectGrace)
		_, err = r.env.Admin.Delete(ctx, key)
		deleted = r.hist.Now()
		return err
	})
	r.awaitLostHold(ctx, t, h, "deleted")
	return deleted
}

// deletedAfterAuthChange takes a hold of its own on a worker's client, with its watch
// placed (so the client's watch stream is open), changes the auth store, takes another hold
// and asks for its Done (its watch is created on a stream opened with a token the change
// made old), and deletes that hold's key, as an operator would, a moment later: the hold
// must be told within toldWithin. Its two names are the run's name with "-auth-a" and
// "-auth-b"; the workers go on meanwhile.
func deletedAfterAuthChange(ctx context.Context, t testing.TB, r *Run) time.Duration {
	cli := r.workers[0].cli.Client
	lock := func(suffix string) (Locker, doner, string) {
		name := r.name + suffix
		lk, err := r.w.Open(cli, name)
		if err != nil {
			t.Fatalf("faulttest: open %s: %v", name, err)
		}
		// A worker's session may end under load (a 2 s TTL, six members on two cores):
		// that is not what this fault is about, so a lock lost so is taken again.
		err = lk.Lock(ctx)
		for try := 1; errors.Is(err, r.w.Lost) && try < 3; try++ {
			t.Logf("faulttest: lock %s: %v; again", name, err)
			err = lk.Lock(ctx)
		}
		if err != nil {
			t.Fatalf("faulttest: lock %s: %v", name, err)
		}
		d, ok := lk.(doner)
		if !ok {
			t.Skip("faulttest: the workload's holds have no Done")
		}
		_ = d.Done()
		return lk, d, r.w.Prefix(name)
	}
	first, _, _ := lock("-auth-a")
	r.wait(time.Second) // for the first hold's watch to be placed
	if _, err := r.env.changeAuth(ctx); err != nil {
		t.Fatal(err)
	}
	later, told, prefix := lock("-auth-b")
	r.wait(reconnectGrace)
	if _, err := r.env.Admin.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		t.Fatalf("faulttest: delete %q: %v", prefix, err)
	}
	deleted := r.hist.Now()
	select {
	case <-told.Done():
	case <-time.After(toldWithin):
		t.Errorf("a hold taken after an auth change, its key deleted, still not told %v later", toldWithin)
	}
	for _, lk := range []Locker{first, later} {
		uctx, cancel := context.WithTimeout(ctx, opTimeout)
		_ = lk.Unlock(uctx) // later's says it was lost
		cancel()
	}
	return deleted
}

// heldKey returns the key of h's hold, or an error matching errHoldGone if it has none.
func (r *Run) heldKey(ctx context.Context, h held) (string, error) {
	resp, err := r.env.Admin.Get(ctx, r.w.Prefix(r.name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return "", fmt.Errorf("find the held key: %w", err)
	}
	for _, kv := range resp.Kvs {
		if kv.CreateRevision == h.token {
			return string(kv.Key), nil
		}
	}
	return "", fmt.Errorf("%w: no key of token %d under %q", errHoldGone, h.token, r.w.Prefix(r.name))
}

// clusterRestarted kills every member during a hold, while others wait, and restarts them
// all on their data.
func clusterRestarted(ctx context.Context, t testing.TB, r *Run) time.Duration {
	c := r.env.Cluster
	var wg sync.WaitGroup
	r.strikeHold(ctx, t, func(held) error {
		for i := range c.Size() {
			wg.Go(func() { c.Kill(i) })
		}
		wg.Wait()
		return nil
	})
	errs := make([]error, c.Size())
	for i := range c.Size() { // together: a member serves once a quorum is back
		wg.Go(func() { errs[i] = c.Restart(i) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("faulttest: restart member %d: %v", i, err)
		}
	}
	r.leader(ctx, t)
	return r.hist.Now()
}

// errHoldGone is what a strike returns when the hold it came to strike had ended already
// (its lease lapsed while a loaded machine starved its renewals): strikeHold then strikes
// the next hold instead.
var errHoldGone = errors.New("the hold had ended before the strike")

// strikeHold runs strike in the middle of the next hold, on its worker's goroutine, between
// the read and the Txn of a fenced write, and returns that hold once strike has returned; it
// stops the test if strike fails, and tries the next hold if strike finds it gone already.
func (r *Run) strikeHold(ctx context.Context, t testing.TB, strike func(held) error) held {
	t.Helper()
	type result struct {
		h   held
		err error
	}
	struck := make(chan result, 1)
	for {
		r.beforeNextWrite(func(wk *worker, token int64) {
			h := held{wk, token}
			struck <- result{h, strike(h)}
		})
		select {
		case res := <-struck:
			switch {
			case errors.Is(res.err, errHoldGone):
				t.Logf("faulttest: the hold of worker %d (token %d) had ended before the strike (%v): striking the next", res.h.wk.id, res.h.token, res.err)
				continue
			case res.err != nil:
				t.Fatalf("faulttest: strike the hold of worker %d: %v", res.h.wk.id, res.err)
			}
			return res.h
		case <-ctx.Done():
			t.Fatalf("faulttest: no worker acquired to strike: %v", ctx.Err())
			return held{}
		}
	}
}

// awaitLostHold waits for h's release and fails t unless the hold ended as lost: a refused
// write or a release that found it lost.
func (r *Run) awaitLostHold(ctx context.Context, t testing.TB, h held, how string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, r.holdLimit()+r.releaseLimit()+r.w.serveBound())
	defer cancel()
	refused := false
	end, err := r.hist.Await(ctx, func(op Op) bool {
		mine := op.Worker == h.wk.id && op.Token == h.token
		refused = refused || (mine && op.Kind == Write && op.Outcome == Refused)
		return mine && op.Kind == Release
	})
	switch {
	case err != nil:
		t.Errorf("the %s holder (worker %d, token %d) never released: %v", how, h.wk.id, h.token, err)
	case end.Outcome == OK:
		t.Errorf("the %s holder released cleanly, as if it had held all along: %v", how, end)
	case !refused && end.Outcome != Refused:
		t.Errorf("the %s holder's hold ended without a refused write or a lost release: %v", how, end)
	}
}

// leader waits for the members to agree on a leader and returns it.
func (r *Run) leader(ctx context.Context, t testing.TB) int {
	t.Helper()
	i, err := r.env.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// progress waits for progressDuring waiters to be served from now on, and fails t if the
// first is not served within the workload's serve bound or the rest take longer again.
func (r *Run) progress(ctx context.Context, t testing.TB, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*r.w.serveBound())
	defer cancel()
	if _, err := r.hist.awaitAcquires(ctx, progressDuring, r.hist.Now(), -1); err != nil {
		t.Errorf("no progress %s: %v", when, err)
	}
}
