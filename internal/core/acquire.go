package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The acquisition path, written once for one name and for several (mutex.Multi): an
// acquisition writes a key under each of its queues in one Txn, so that all of them share
// one create revision, its token, and is served once no queue has more ahead of its key
// than the spec allows. One name is an acquisition of one queue. Any two acquisitions of
// several names are in the same order on every name they share (the order of their
// revisions), so no cycle of waits can form, and a single lock on any of the names queues
// with them as with anyone.

// acquisition is one attempt to acquire: a slot (a key) under each queue, claimed on the
// session's lease. Every queue has the same client and session source.
type acquisition struct {
	qs    []*Queue
	spec  Spec
	sess  *Session
	slots []*slot
	// capacity is the capacity it was served under, when a change of it was heard while
	// it waited (Spec.CapacityMark); 0: the spec's.
	capacity int
	// claims are its uses of its names (Spec.Use), whose guards are the last useGuards of
	// spec.Guard (see withAcquisition).
	claims    []Claim
	useGuards int
	// heardAt is the revision at which the hub of its one name heard it served (see
	// Hold.near); 0 when a read served it or it did not wait.
	heardAt int64
}

func (a *acquisition) cli() *clientv3.Client { return a.qs[0].cli }

// describe names the acquisition's keys in an error: the first, and how many more.
func (a *acquisition) describe() string {
	if len(a.slots) == 1 {
		return a.slots[0].key()
	}
	return fmt.Sprintf("%s and %d more", a.slots[0].key(), len(a.slots)-1)
}

func (a *acquisition) keys() []string {
	keys := make([]string, len(a.slots))
	for i, sl := range a.slots {
		keys[i] = sl.key()
	}
	return keys
}

// Acquire enqueues and waits until spec's predicate holds, then returns the hold. onKey, if
// not nil, learns the key before the wait. Uncontended it costs one Txn; a waiter adds one
// watch and, when revisions moved between its Txn and its watch, one Range; once the last
// predecessor's delete event arrives it returns with no further RPC. On failure, including
// ctx ending, it deletes its key before returning, or, if etcd cannot be reached within
// cleanupWait, in the background (see janitor).
func (q *Queue) Acquire(ctx context.Context, spec Spec, onKey func(string)) (*Hold, error) {
	return q.AcquireNotify(ctx, spec, onKey, nil)
}

// AcquireNotify is Acquire, and calls onQueued, if not nil, once the key is in etcd (its
// place in line is taken), before the wait; not at all if the key could not be written.
func (q *Queue) AcquireNotify(ctx context.Context, spec Spec, onKey func(string), onQueued func()) (*Hold, error) {
	var onKeys func([]string)
	if onKey != nil {
		onKeys = func(keys []string) { onKey(keys[0]) }
	}
	return acquire(ctx, []*Queue{q}, spec, onKeys, onQueued, newHoldOf)
}

// AcquireAll is Acquire over several queues at once: one key on each, written in one Txn,
// served once no key is ahead of any of them; it returns the Group of the keys. The queues
// must share one client and one session source, and spec must be exclusive (Capacity and
// Weight 1, no Guard). Its costs are Acquire's, with the hub of each name it waits on.
func AcquireAll(ctx context.Context, qs []*Queue, spec Spec, onKeys func([]string)) (*Group, error) {
	return acquire(ctx, qs, spec, onKeys, nil, newGroup)
}

// TryAcquire takes a hold only if it would be served at once, having written nothing
// otherwise. With spec.slots() <= 1 that is when no key is in spec.Ahead: one Txn, ErrLocked
// when it fails. With more slots it is when the keys there weigh less than spec.slots() (see
// tryCounted): ErrNoPermits, after one read-only Txn, when they do not. With Passes, a try
// that finds keys ahead counts them as with more slots (a read, and a Txn if they all pass).
// Either way ErrGuard when spec.Guard fails.
func (q *Queue) TryAcquire(ctx context.Context, spec Spec) (*Hold, error) {
	counted := func(a *acquisition) (*Hold, error) { return tryCounted(ctx, a) }
	if spec.slots() > 1 {
		return withAcquisition(ctx, []*Queue{q}, spec, counted)
	}
	h, err := withAcquisition(ctx, []*Queue{q}, spec, func(a *acquisition) (*Hold, error) {
		return try(ctx, a, newHoldOf)
	})
	if len(spec.Passes) > 0 && errors.Is(err, ErrLocked) && ctx.Err() == nil {
		// A key is ahead, which may pass: count them by their modes.
		return withAcquisition(ctx, []*Queue{q}, spec, counted)
	}
	return h, err
}

// TryAcquireAll takes the Group of qs only if no name has a key: one Txn, which writes
// nothing otherwise, and ErrLocked. The queues and spec are as for AcquireAll.
func TryAcquireAll(ctx context.Context, qs []*Queue, spec Spec) (*Group, error) {
	return withAcquisition(ctx, qs, spec, func(a *acquisition) (*Group, error) {
		return try(ctx, a, newGroup)
	})
}

// Join writes a key of spec.Kind that waits for nobody, and returns its hold: a
// participant of a barrier, whose place is its create revision. spec.Ahead is read, and
// not waited for. One Txn; ErrGuard when spec.Guard fails, having written nothing.
func (q *Queue) Join(ctx context.Context, spec Spec) (*Hold, error) {
	return withAcquisition(ctx, []*Queue{q}, spec, func(a *acquisition) (*Hold, error) {
		e, err := a.enqueue(ctx)
		if e.rev == 0 {
			a.abandon(ctx, 0, e.unknown)
			return nil, err
		}
		return grant(ctx, a, e.rev, err, newHoldOf)
	})
}

// A maker makes what a granted acquisition holds (a Hold, or a Group) from its keys' slots
// and their create revision.
type maker[T any] func(cli *clientv3.Client, sess *Session, slots []*slot, rev int64) T

func newHoldOf(cli *clientv3.Client, sess *Session, slots []*slot, rev int64) *Hold {
	return newHold(cli, sess, slots[0], rev)
}

func acquire[T any](ctx context.Context, qs []*Queue, spec Spec, onKeys func([]string), onQueued func(), mk maker[T]) (T, error) {
	return withAcquisition(ctx, qs, spec, func(a *acquisition) (T, error) {
		if onKeys != nil {
			onKeys(a.keys())
		}
		for _, q := range qs {
			defer inLine(q.hubKey())() // from its write: see pooled
		}
		e, err := a.enqueue(ctx)
		if e.rev == 0 {
			a.abandon(ctx, 0, e.unknown)
			var none T
			return none, err
		}
		if err == nil && onQueued != nil {
			onQueued()
		}
		if err == nil {
			spec.Tel.enqueued(ctx, e.most(), e.rev)
		}
		if err == nil && e.most() >= spec.slots() {
			err = a.wait(ctx, e)
			if spec.Handover && errors.Is(err, errDeletedWhileWaiting) && a.sess.lostErr() == nil {
				if h := a.takeHandover(ctx, e.rev); h != nil {
					for _, sl := range a.slots {
						sl.free() // its own key is gone: the handover deleted it
					}
					bound(a.qs, h)
					if t, ok := any(h).(T); ok {
						return t, nil
					}
				}
				if ctx.Err() != nil {
					err = ctx.Err() // it gave its answer to a handover up for ctx (see takeHandover)
				}
			}
		}
		return grant(ctx, a, e.rev, err, mk)
	})
}

// withAcquisition runs attempt with an acquisition of qs under spec on a live session (see
// withSession); attempt owns its slots from then on.
//
// With spec.Use, every Txn that may write a key also holds spec.Use's claim on each name
// (Claim.Guard, in spec.Guard); a guard that fails because a key of another use is there
// is ErrOtherKind, naming it.
//
// A client whose user may not read the name's other kinds' ranges (granted its kind's
// sub-ranges alone, see docs/security.md) has every such Txn refused: its queues then
// write without the guard, as before there was one, and it cannot tell another kind's keys.
func withAcquisition[T any](ctx context.Context, qs []*Queue, spec Spec, attempt func(*acquisition) (T, error)) (T, error) {
	guarded := spec.Use != 0
	for _, q := range qs {
		guarded = guarded && !q.unguarded.Load()
	}
	t, err := acquisitionOf(ctx, qs, spec, guarded, attempt)
	if guarded && errors.Is(err, rpctypes.ErrPermissionDenied) {
		for _, q := range qs {
			q.unguarded.Store(true)
		}
		return acquisitionOf(ctx, qs, spec, false, attempt)
	}
	return t, err
}

// acquisitionOf is withAcquisition, with the claims' guards or without.
func acquisitionOf[T any](ctx context.Context, qs []*Queue, spec Spec, guarded bool, attempt func(*acquisition) (T, error)) (T, error) {
	var claims []Claim
	useGuards := 0
	if guarded {
		guard := slices.Clip(spec.Guard)
		for _, q := range qs {
			c := Claim{q.prefix, spec.Use}
			claims = append(claims, c)
			guard = append(guard, c.Guard()...)
		}
		useGuards = len(guard) - len(spec.Guard)
		spec.Guard = guard
	}
	t, err := withSession(ctx, qs[0].sessions, func(sess *Session) (T, error) {
		a := &acquisition{qs: qs, spec: spec, sess: sess, slots: make([]*slot, len(qs)), claims: claims, useGuards: useGuards}
		for i, q := range qs {
			a.slots[i] = claimSlot(q.prefix, spec.keyKind(), sess)
		}
		return attempt(a)
	})
	if errors.Is(err, ErrGuard) && len(claims) > 0 {
		if other := Check(ctx, qs[0].cli, claims...); other != nil {
			return t, other
		}
	}
	return t, err
}

// leaseTries bounds the leases one acquisition takes when each is found gone before
// anything was written on it: a lease that vanishes again and again moments after its grant
// is no expiry, and a new lease at once would spin.
const leaseTries = 3

// withSession runs attempt with a live session of sessions. When the lease turns out to be
// gone before anything was written (the shared session expired while unused, an operator
// revoked it), it takes a new lease and runs attempt again after a pause, up to leaseTries
// leases, unless Shutdown revoked it (an acquisition under way then fails, as Shutdown
// promises) or the endpoints are of different clusters (ErrMixedClusters).
func withSession[T any](ctx context.Context, sessions Sessions, attempt func(*Session) (T, error)) (T, error) {
	var none T
	if err := ctx.Err(); err != nil {
		return none, err // before any I/O, which would only have to be undone
	}
	var b Backoff
	for try := 1; ; try++ {
		sess, err := sessions.Session(ctx)
		if err != nil {
			return none, err
		}
		h, err := attempt(sess)
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return h, err
		}
		switch {
		case sess.endedBy(errShutdown):
			return none, fmt.Errorf("%w: %w", ErrLost, errShutdown)
		case sess.ka == nil:
			// The caller's session outlived its lease (revoked: its Done closes only when
			// the keep-alive notices). It cannot be replaced; trying again would spin.
			return none, fmt.Errorf("%w: the lease of the session given with WithSession is gone", ErrLost)
		}
		if err := sessions.Expired(ctx, sess); err != nil {
			return none, err
		}
		if try == leaseTries {
			return none, fmt.Errorf("%d leases in a row were not found moments after their grant (by cluster %x): are the endpoints members of one cluster? %w", try, sess.cluster, err)
		}
		if err := b.wait(ctx); err != nil {
			return none, err
		}
	}
}

// grant makes what the acquisition holds, its keys written at rev, unless it failed (err)
// or its session ended meanwhile: a Txn sent after the session's local deadline may still
// have been applied (a new etcd leader can extend a lease the old one was about to let go),
// and a hold on a lease that may be gone is no hold. The keys are then removed.
func grant[T any](ctx context.Context, a *acquisition, rev int64, err error, mk maker[T]) (T, error) {
	if err == nil {
		err = a.sess.lostErr()
	}
	if err == nil {
		err = clockOf(a.cli()).above(rev)
	}
	if err != nil {
		a.abandon(ctx, rev, false)
		var none T
		return none, err
	}
	t := mk(a.cli(), a.sess, a.slots, rev)
	if h, ok := any(t).(*Hold); ok {
		h.capacity = int32(a.capacity)
		if a.heardAt != 0 && a.spec.slots() == 1 && a.qs[0].hubKey().mode == deletesOnly {
			h.near, h.at = true, a.heardAt
		}
	}
	bound(a.qs, t)
	return t, nil
}

// abandon cleans up after an acquisition that did not become a hold: it removes the keys it
// wrote at create revision rev, and gives the slots back once the keys are known to be gone.
// rev is 0 when no answer said whether the keys were written: with unknown, they may have
// been; without, nothing was. The first try is bounded by cleanupWait; what is not done then
// is left to the janitor.
//
// A write that got no answer may even be applied after the cleanup, or after the hold a
// later try of it made is released: it then creates the keys anew, on a lease the session
// keeps renewing. So an acquisition whose write had a try without an answer retires its
// session at once (see write): the next acquisitions take a new lease, and the old one is
// revoked once no slot is claimed on it, taking such keys with it.
func (a *acquisition) abandon(ctx context.Context, rev int64, unknown bool) {
	if rev == 0 && !unknown {
		for _, sl := range a.slots {
			sl.free()
		}
		return
	}
	c := &keysCleanup{cli: a.cli(), slots: a.slots, revs: make([]int64, len(a.slots)), known: rev != 0}
	for i := range c.revs {
		c.revs[i] = rev
	}
	dctx, cancel := detached(ctx, cleanupWait)
	done := c.attempt(dctx)
	cancel()
	if !done {
		janitorOf(a.cli()).add(c)
	}
}

// answer is what etcd said to a Txn that may write an acquisition's keys (see write).
type answer struct {
	resp *clientv3.TxnResponse // nil if no answer came
	// unknown: some try got no answer, so the keys may have been written all the same.
	unknown bool
	// own, when the Txn's If failed: the acquisition's keys, by queue, read by the first
	// ops of its Else (nil where absent); present counts them, rev is their create revision.
	own     []*mvccpb.KeyValue
	present int
	rev     int64
}

// write commits the Txn that build makes of a Txn that may write the acquisition's keys:
// its If holds only while none of them is there, and its Else starts with one OpGet per
// key, in the order of the queues. Every write of every acquisition goes through it, and so
// does what every answer means:
//
//   - no answer (resp nil): the keys may have been written if unknown; the caller abandons.
//   - the If held: the keys were written at the answer's revision.
//   - the If failed with none of the keys there: nothing was written (a guard, or the keys
//     ahead, said no).
//   - the If failed with the keys there: a try of this call whose answer was lost wrote
//     them, or a late one did; they are the acquisition's (see takeOver), all written at
//     one revision (when only some are there, another deleted the rest). Unless they were
//     created before this call began: then the cluster brought back keys of an older life
//     (a restore), which are never adopted, because their create revision would be a token
//     that went back: ErrRewound, and every hold of the client ends (rewind).
//
// Without an answer it returns CommitWrite's error as it is. A try without an answer
// retires the session (see abandon).
func (a *acquisition) write(ctx context.Context, build func(clientv3.Txn) clientv3.Txn) (answer, error) {
	cli := a.cli()
	before := clockOf(cli).now() // every key this call writes is created after it
	res, err := CommitWrite(ctx, cli, build)
	if res.Unknown {
		a.qs[0].sessions.Retire(a.sess)
	}
	ans := answer{resp: res.Resp, unknown: res.Unknown}
	switch {
	case ans.resp == nil:
		return ans, err
	case ans.resp.Succeeded:
		ans.rev = ans.resp.Header.Revision
		return ans, err
	}
	ans.own = make([]*mvccpb.KeyValue, len(a.slots))
	for i := range a.slots {
		if kvs := ans.resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
			ans.own[i], ans.rev = kvs[0], kvs[0].CreateRevision
			ans.present++
		}
	}
	if ans.present > 0 && ans.rev <= before {
		rw := fmt.Errorf("%w: key of %s came back at create revision %d, before revision %d seen already", ErrRewound, a.describe(), ans.rev, before)
		rewind(cli, rw)
		return ans, fmt.Errorf("%w: %w", ErrLost, rw)
	}
	return ans, err
}

// takeOver gives the acquisition's keys that a write found already there (see write) the
// acquisition's value, so that none keeps an older one (another owner, a stale proposal):
// one fenced Put for each key whose value differs, and only then. Kept out of the acquiring
// Txn, where it would cost every acquisition.
func (a *acquisition) takeOver(ctx context.Context, own []*mvccpb.KeyValue) error {
	for _, kv := range own {
		if string(kv.Value) == a.spec.Value {
			continue
		}
		key := string(kv.Key)
		_, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return a.cli().Txn(clientv3.WithRequireLeader(ctx)).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", kv.CreateRevision)).
				Then(clientv3.OpPut(key, a.spec.Value, clientv3.WithLease(a.sess.Lease()))).
				Commit()
		})
		if err != nil {
			return fmt.Errorf("take over %s: %w", key, err)
		}
	}
	return nil
}

// enqueued is what enqueue learned: the keys' create revision (0 if none is known to have
// been written), the revision its counts reflect, and how much is ahead of each key.
type enqueued struct {
	rev, snap int64
	ahead     []int
	unknown   bool // with rev 0: a try got no answer, so the keys may have been written
}

// most is the largest count ahead of the keys.
func (e enqueued) most() int {
	n := 0
	for _, a := range e.ahead {
		n = max(n, a)
	}
	return n
}

// enqueue writes the keys once, whatever the retries, in one Txn that also reads what is
// ahead of each, and returns what it learned. With ctx ended it returns ctx's error, and
// the keys' revision if its Txn was applied.
func (a *acquisition) enqueue(ctx context.Context) (enqueued, error) {
	n, spec := len(a.qs), a.spec
	cmps := make([]clientv3.Cmp, 0, n+len(spec.Guard))
	var then []clientv3.Op
	orElse := make([]clientv3.Op, 0, 2*n)
	weighers := make([]weigher, n)
	for i, q := range a.qs {
		weighers[i] = weigherOf(q, spec)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(a.slots[i].key()), "=", 0))
		// Every read before every put: each key there is ahead.
		then = append(then, weighers[i].reads(q.prefix+spec.Ahead)...)
		orElse = append(orElse, clientv3.OpGet(a.slots[i].key()))
	}
	for i, q := range a.qs {
		then = append(then, clientv3.OpPut(a.slots[i].key(), spec.Value, clientv3.WithLease(a.sess.Lease())))
		orElse = append(orElse, clientv3.OpGet(q.prefix+spec.Ahead, weighers[i].keys()...))
	}
	ans, err := a.write(ctx, func(t clientv3.Txn) clientv3.Txn {
		return t.If(append(cmps, spec.Guard...)...).Then(then...).Else(orElse...)
	})
	resp := ans.resp
	switch {
	case resp == nil && ctx.Err() != nil:
		return enqueued{unknown: ans.unknown}, ctx.Err()
	case resp == nil:
		return enqueued{unknown: ans.unknown}, fmt.Errorf("enqueue %s: %w", a.describe(), err)
	case resp.Succeeded:
		e := enqueued{rev: ans.rev, snap: ans.rev, ahead: make([]int, n)}
		at := 0
		for i, w := range weighers {
			e.ahead[i] = w.weight(resp.Responses[at:])
			at += w.nreads()
		}
		return e, err
	case ans.present == 0 && err != nil:
		return enqueued{unknown: ans.unknown}, err
	case ans.present == 0 && len(spec.Guard) > 0:
		return enqueued{unknown: ans.unknown}, ErrGuard // the keys are absent, so the guard failed
	case ans.present == 0:
		return enqueued{unknown: ans.unknown}, fmt.Errorf("%w: keys %s vanished inside a Txn", ErrLost, a.describe())
	case err != nil:
		return enqueued{rev: ans.rev}, err
	case ans.present < n:
		return enqueued{rev: ans.rev}, fmt.Errorf("%w: %d of the keys %s deleted while enqueuing", ErrLost, n-ans.present, a.describe())
	}
	e := enqueued{rev: ans.rev, snap: resp.Header.Revision, ahead: make([]int, n)}
	for i, w := range weighers {
		e.ahead[i] = w.ahead(resp.Responses[n+i].GetResponseRange().Kvs, ans.rev)
	}
	return e, a.takeOver(ctx, ans.own)
}

// wait returns once no key of the acquisition has spec.slots() or more (keys or units)
// ahead, counting the deletes the client's hubs of its names dispatch; ErrLost when one of
// its keys or its session goes first. Names with little enough ahead already are not
// watched: a later delete of their key is the hold's loss, which its own watch reports. A
// waiter far back in line approaches first (see approach), one name after another: a name
// served stays served. Near the head it sends no RPC itself.
func (a *acquisition) wait(ctx context.Context, e enqueued) error {
	type waiting struct {
		h  *hub
		w  *queueWaiter
		sl *slot // its key's
	}
	wake := make(chan struct{}, 1) // one for every waiter: each signal makes the loop look at all
	var subs []waiting
	var read []servedBy  // names a read served (approach), for the lock-delay
	var lingers []func() // the approaches' watches, kept until the hubs' are placed (see awaitDeletes)
	delayed := false
	defer func() {
		for _, s := range subs {
			s.h.leave(s.w)
		}
		for _, l := range lingers {
			l()
		}
	}()
	for i, q := range a.qs {
		if e.ahead[i] < a.spec.slots() {
			continue
		}
		snap, ahead, far := e.snap, e.ahead[i], a.far(q, e.ahead[i])
		if far {
			var err error
			var linger func()
			if snap, ahead, linger, err = a.approach(ctx, q, a.slots[i].key(), e.rev); err != nil {
				return whyGone(ctx, a.cli(), a.slots[i], e.rev, err)
			}
			if linger != nil {
				lingers = append(lingers, linger)
			}
			if ahead >= 0 && ahead < a.spec.slots() {
				read = append(read, servedBy{at: time.Now(), prefix: q.prefix + a.spec.Ahead, rev: e.rev, from: e.snap, to: snap})
				continue
			}
		}
		w := newQueueWaiter(a.slots[i].key(), e.rev, snap, ahead, q.prefix+a.spec.Ahead, a.spec.slots())
		w.weigh, w.wake, w.far = weigherOf(q, a.spec), wake, far
		if a.spec.CapacityMark != "" {
			w.mark, w.units = q.prefix+a.spec.CapacityMark, a.spec.weight()
		}
		subs = append(subs, waiting{join(q.hubKey(), w), w, a.slots[i]})
	}
	for {
		pending, placed := false, true
		for _, s := range subs {
			s.h.mu.Lock()
			done, err := s.w.outcome()
			placed = placed && s.h.started
			s.h.mu.Unlock()
			if err != nil {
				return whyGone(ctx, a.cli(), s.sl, e.rev, err)
			}
			pending = pending || !done
		}
		if placed && lingers != nil {
			for _, l := range lingers {
				l()
			}
			lingers = nil
		}
		if !pending && a.qs[0].life.lockDelay > 0 && !delayed {
			delayed = true
			for _, s := range subs {
				s.h.mu.Lock()
				read = append(read, s.w.by)
				s.h.mu.Unlock()
			}
			if err := a.lockDelay(ctx, read); err != nil {
				return err
			}
			continue // its keys may have gone meanwhile
		}
		if !pending {
			for _, s := range subs {
				s.h.mu.Lock()
				if s.w.mark != "" {
					a.capacity = s.w.slots + s.w.units - 1
				}
				if len(a.qs) == 1 {
					a.heardAt = s.w.heard
				}
				s.h.mu.Unlock()
			}
			return nil
		}
		select {
		case <-wake:
		case <-a.sess.Done():
			return a.sess.lostErr()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
