package core

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Queue is the wait-for-predecessor queue of one name. An acquisition writes one key under
// the name prefix, bound to the session's lease; its create revision is its place in line
// and its fencing token. Keys created later are behind it, so the set of keys ahead only
// shrinks: one snapshot taken in the writing Txn plus the delete events after it tell a
// waiter when it is served, with no polling.
type Queue struct {
	cli      *clientv3.Client
	sessions Sessions
	prefix   string // NamePrefix of the name
	arrivals bool   // the client's watch on the name delivers new keys too (see WatchArrivals)
}

// NewQueue returns the queue of the name whose key prefix is prefix. It does no I/O.
func NewQueue(cli *clientv3.Client, sessions Sessions, prefix string) *Queue {
	return &Queue{cli: cli, sessions: sessions, prefix: prefix}
}

// WatchArrivals makes the queue's watch deliver new keys as well as deletes, which
// WatchBehind needs, and returns q. It costs one more event per acquisition on the name for
// each client that waits on it. Call it before the first use.
func (q *Queue) WatchArrivals() *Queue {
	q.arrivals = true
	return q
}

func (q *Queue) hubKey() hubKey {
	k := hubKey{cli: q.cli, prefix: q.prefix, mode: deletesOnly}
	if q.arrivals {
		k.mode = arrivals
	}
	return k
}

// Prefix is the key prefix of the queue's name.
func (q *Queue) Prefix() string { return q.prefix }

// Client is the etcd client the queue works through.
func (q *Queue) Client() *clientv3.Client { return q.cli }

// Spec describes one kind of acquisition in the queue's own terms: what kind of key it
// writes, which keys it waits behind, and how many units it takes of how many the name has.
// Core derives the rest: the key's sub-prefix (which carries a weight above one, see
// units.go) and the threshold a waiter is served at.
type Spec struct {
	Kind  string // sub-prefix of the acquisition's key under the name ("" for a mutex)
	Ahead string // sub-prefix whose earlier keys count against it ("" for every kind)
	// Capacity is how many units the keys of Ahead may hold at once (0 means 1), and Weight
	// how many this acquisition takes (0 means 1; at most Capacity). It is served once the
	// keys ahead of it weigh no more than Capacity-Weight. With a Capacity above 1 a key may
	// weigh more than one unit: the acquiring Txn then also reads the keys that do.
	Capacity, Weight int
	Value            string // stored in the key
	// Tel, if not nil, records where a blocking acquisition joined the line.
	Tel *Telemetry
	// Guard, if not empty, is ANDed into the If of every Txn that may write the key: when
	// it fails, the acquisition writes nothing and returns ErrGuard (see try.go).
	Guard []clientv3.Cmp
}

func (s Spec) capacity() int { return max(s.Capacity, 1) }

func (s Spec) weight() int { return max(s.Weight, 1) }

// slots is the threshold of the spec: it is served once what is ahead weighs less.
func (s Spec) slots() int { return s.capacity() - s.weight() + 1 }

// weighted reports whether the keys ahead may weigh more than one unit each.
func (s Spec) weighted() bool { return s.capacity() > 1 }

// keyKind is the sub-prefix the acquisition's key goes under: Kind, with its weight when
// above one (see unitsKind).
func (s Spec) keyKind() string { return unitsKind(s.Kind, s.weight()) }

// Acquire enqueues and waits until spec's predicate holds, then returns the hold. onKey, if
// not nil, learns the key before the wait. Uncontended it costs one Txn; a waiter adds one
// watch and, when revisions moved between its Txn and its watch, one Range; once the last
// predecessor's delete event arrives it returns with no further RPC. On failure, including
// ctx ending, it deletes its key before returning, or, if etcd cannot be reached within a
// second, in the background (see janitor).
func (q *Queue) Acquire(ctx context.Context, spec Spec, onKey func(string)) (*Hold, error) {
	return q.AcquireNotify(ctx, spec, onKey, nil)
}

// AcquireNotify is Acquire, and calls onQueued, if not nil, once the key is in etcd (its
// place in line is taken), before the wait; not at all if the key could not be written.
func (q *Queue) AcquireNotify(ctx context.Context, spec Spec, onKey func(string), onQueued func()) (*Hold, error) {
	return q.withSlot(ctx, spec.keyKind(), func(sess *Session, sl *slot) (*Hold, error) {
		if onKey != nil {
			onKey(sl.key())
		}
		e, err := q.enqueue(ctx, sess, spec, sl.key())
		if e.rev == 0 {
			q.abandon(ctx, sl, 0, e.unknown)
			return nil, err
		}
		if err == nil && onQueued != nil {
			onQueued()
		}
		if err == nil {
			spec.Tel.enqueued(ctx, e.ahead, e.rev)
		}
		if err == nil && e.ahead >= spec.slots() {
			err = q.wait(ctx, sess, spec, sl.key(), e)
		}
		return q.grant(ctx, sess, sl, e.rev, err)
	})
}

// withSlot runs attempt with a live session and a slot claimed on its lease; attempt owns
// the slot from then on (see withSession).
func (q *Queue) withSlot(ctx context.Context, kind string, attempt func(*Session, *slot) (*Hold, error)) (*Hold, error) {
	return withSession(ctx, q.sessions, func(sess *Session) (*Hold, error) {
		return attempt(sess, claimSlot(q.prefix, kind, sess))
	})
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
	var b backoff
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

// grant makes the hold of the key at rev that an acquisition wrote, unless it failed (err)
// or its session ended meanwhile: a Txn sent after the session's local deadline may still
// have been applied (a new etcd leader can extend a lease the old one was about to let go),
// and a hold on a lease that may be gone is no hold. The key is then removed.
func (q *Queue) grant(ctx context.Context, sess *Session, sl *slot, rev int64, err error) (*Hold, error) {
	if err == nil {
		err = sess.lostErr()
	}
	if err == nil {
		err = clockOf(q.cli).above(rev)
	}
	if err != nil {
		q.abandon(ctx, sl, rev, false)
		return nil, err
	}
	return newHold(q.cli, sess, sl, rev), nil
}

// abandon cleans up after an acquisition that did not become a hold: it removes the key
// the acquisition wrote at create revision rev, and gives the slot back once the key is
// known to be gone. rev is 0 when no answer said whether a key was written: with unknown,
// one may have been; without, nothing was. The first try is bounded by a second; what is
// not done then is left to the janitor.
//
// A write that got no answer may even be applied after the cleanup, or after the hold a
// later try of it made is released: it then creates the key anew, on a lease the session
// keeps renewing. So an acquisition whose write had a try without an answer retires its
// session at once: the next acquisitions take a new lease, and the old
// one is revoked once no slot is claimed on it, taking such a key with it.
func (q *Queue) abandon(ctx context.Context, sl *slot, rev int64, unknown bool) {
	if rev == 0 && !unknown {
		sl.free()
		return
	}
	c := &keyCleanup{cli: q.cli, slot: sl, key: sl.key(), rev: rev}
	dctx, cancel := detached(ctx, cleanupWait)
	done := c.attempt(dctx)
	cancel()
	if !done {
		janitorOf(q.cli).add(c)
	}
}

// enqueued is what enqueue learned: the key's create revision (0 if none is known to have
// been written), the revision its count reflects, and how many keys are ahead of it.
type enqueued struct {
	rev, snap int64
	ahead     int
	unknown   bool // with rev 0: a try got no answer, so the key may have been written
}

// enqueue writes key once, whatever the retries, and returns what it learned. With ctx
// ended it returns ctx's error, and the key's revision if its Txn was applied.
func (q *Queue) enqueue(ctx context.Context, sess *Session, spec Spec, key string) (enqueued, error) {
	aheadRange, w := q.prefix+spec.Ahead, weigherOf(q, spec)
	before := clockOf(q.cli).now() // every key this call writes is created after it
	res, err := commitWrite(ctx, q.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, spec.Guard...)...).
			// Read before the put: every key there is ahead.
			Then(append(w.reads(aheadRange), clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease())))...).
			// The key is there already (written by a try of this call whose answer was lost,
			// or late): it is this slot's, so take its place (see takeOver).
			Else(clientv3.OpGet(key), clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	})
	if res.unknown {
		q.sessions.Retire(sess) // see abandon
	}
	resp := res.resp
	switch {
	case resp == nil && ctx.Err() != nil:
		return enqueued{unknown: res.unknown}, ctx.Err()
	case resp == nil:
		return enqueued{unknown: res.unknown}, fmt.Errorf("enqueue %s: %w", key, err)
	case resp.Succeeded:
		rev := resp.Header.Revision
		return enqueued{rev: rev, snap: rev, ahead: w.weight(resp.Responses)}, err
	}
	own := resp.Responses[0].GetResponseRange().Kvs
	switch {
	case len(own) == 0 && len(spec.Guard) > 0:
		return enqueued{unknown: res.unknown}, ErrGuard // the key is absent, so the guard failed
	case len(own) == 0:
		return enqueued{unknown: res.unknown}, fmt.Errorf("%w: key %s vanished inside a Txn", ErrLost, key)
	}
	rev := own[0].CreateRevision
	if rev <= before {
		// Not written by this call: no earlier use of the slot can have left it (a slot is
		// reused only once its key is known gone, and a session whose write may land late is
		// retired), so the cluster brought back a key of an older life. Never adopt it: its
		// create revision would be a token that went back.
		err := fmt.Errorf("%w: key %s came back at create revision %d, before revision %d seen already", ErrRewound, key, rev, before)
		rewind(q.cli, err)
		return enqueued{rev: rev}, fmt.Errorf("%w: %w", ErrLost, err)
	}
	e := enqueued{rev: rev, snap: resp.Header.Revision, ahead: w.ahead(resp.Responses[1].GetResponseRange().Kvs, rev)}
	if err == nil {
		err = q.takeOver(ctx, sess, own[0], spec.Value)
	}
	return e, err
}

// takeOver gives a key of the slot that an acquisition found already there (a try of the
// same call whose answer was lost, or a write applied late) the acquisition's value, so that
// it never keeps an older one (another owner, a stale proposal): one fenced Put, and only
// then. Kept out of the acquiring Txn, where it would cost every acquisition.
func (q *Queue) takeOver(ctx context.Context, sess *Session, kv *mvccpb.KeyValue, value string) error {
	if string(kv.Value) == value {
		return nil
	}
	key := string(kv.Key)
	_, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", kv.CreateRevision)).
			Then(clientv3.OpPut(key, value, clientv3.WithLease(sess.Lease()))).
			Commit()
	})
	if err != nil {
		return fmt.Errorf("take over %s: %w", key, err)
	}
	return nil
}

// wait returns once fewer than spec.slots() keys (or units) are ahead of key, counting the deletes its
// hub dispatches; ErrLost when its own key or session goes first. It sends no RPC itself.
func (q *Queue) wait(ctx context.Context, sess *Session, spec Spec, key string, e enqueued) error {
	w := newQueueWaiter(key, e.rev, e.snap, e.ahead, q.prefix+spec.Ahead, spec.slots())
	w.weigh = weigherOf(q, spec)
	h := join(q.hubKey(), w)
	defer h.leave(w)
	for {
		h.mu.Lock()
		done, err := w.outcome()
		h.mu.Unlock()
		if done {
			return err
		}
		select {
		case <-w.wake:
		case <-sess.Done():
			return sess.lostErr()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
