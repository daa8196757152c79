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

func (q *Queue) hubKey() hubKey { return hubKey{cli: q.cli, prefix: q.prefix, puts: q.arrivals} }

// Prefix is the key prefix of the queue's name.
func (q *Queue) Prefix() string { return q.prefix }

// Client is the etcd client the queue works through.
func (q *Queue) Client() *clientv3.Client { return q.cli }

// Spec describes one kind of acquisition.
type Spec struct {
	Kind  string // sub-prefix of the acquisition's key under the name ("" for a mutex)
	Ahead string // sub-prefix whose earlier keys count against it ("" for every kind)
	Slots int    // it is served once fewer than Slots keys are ahead in Ahead
	Value string // stored in the key
	// Guard, if not empty, is ANDed into the If of every Txn that may write the key: when
	// it fails, the acquisition writes nothing and returns ErrGuard (see guard.go).
	Guard []clientv3.Cmp
}

// Acquire enqueues and waits until spec's predicate holds, then returns the hold. onKey, if
// not nil, learns the key before the wait. Uncontended it costs one Txn; a waiter adds one
// watch and, when revisions moved between its Txn and its watch, one Range; once the last
// predecessor's delete event arrives it returns with no further RPC. On failure, including
// ctx ending, it deletes its key before returning.
func (q *Queue) Acquire(ctx context.Context, spec Spec, onKey func(string)) (*Hold, error) {
	return q.AcquireNotify(ctx, spec, onKey, nil)
}

// AcquireNotify is Acquire, and calls onQueued, if not nil, once the key is in etcd (its
// place in line is taken), before the wait; not at all if the key could not be written.
func (q *Queue) AcquireNotify(ctx context.Context, spec Spec, onKey func(string), onQueued func()) (*Hold, error) {
	return q.withSlot(ctx, spec.Kind, func(sess *Session, slot *slot) (*Hold, error) {
		key := slot.key()
		if onKey != nil {
			onKey(key)
		}
		rev, seen, ahead, err := q.enqueue(ctx, sess, spec, key)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, ErrGuard) {
			return nil, err // nothing was written
		}
		if err == nil && onQueued != nil {
			onQueued()
		}
		if err == nil && ahead >= spec.Slots {
			err = q.wait(ctx, sess, spec, key, rev, seen, ahead)
		}
		if err != nil {
			q.remove(ctx, key)
			return nil, err
		}
		return newHold(q.cli, sess, slot, rev), nil
	})
}

// withSlot runs attempt with a live session and a slot claimed on its lease, and frees the
// slot unless attempt returns a hold, which then owns it. When the lease turns out to be gone
// (the shared session expired while unused), it takes a new lease and runs attempt again.
func (q *Queue) withSlot(ctx context.Context, kind string, attempt func(*Session, *slot) (*Hold, error)) (*Hold, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // before any I/O, which would only have to be undone
	}
	for {
		sess, err := q.sessions.Session(ctx)
		if err != nil {
			return nil, err
		}
		slot := claimSlot(q.prefix, kind, sess.Lease())
		h, err := attempt(sess, slot)
		if err == nil {
			return h, nil
		}
		slot.free()
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, err
		}
		if _, fixed := q.sessions.(fixedSession); fixed {
			// The caller's session outlived its lease (revoked: its Done closes only when
			// the keep-alive notices). It cannot be replaced; trying again would spin.
			return nil, fmt.Errorf("%w: the lease of the session given with WithSession is gone", ErrLost)
		}
		q.sessions.Expired(sess)
	}
}

// enqueue writes key once, whatever the retries, and returns its create revision, the
// revision its count reflects, and how many keys are ahead of it in spec.Ahead.
func (q *Queue) enqueue(ctx context.Context, sess *Session, spec Spec, key string) (rev, seen int64, ahead int, err error) {
	aheadRange := q.prefix + spec.Ahead
	resp, err := commitWrite(ctx, q.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, spec.Guard...)...).
			// Read before the put: every key there is ahead.
			Then(clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithCountOnly()),
				clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease()))).
			// The key is there already (written by a try whose answer was lost, or left by a
			// cleanup that could not reach etcd): it is this slot's, so take its place.
			Else(clientv3.OpGet(key), clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return 0, 0, 0, ctx.Err() // the key may be written: Acquire removes it
	case err != nil:
		return 0, 0, 0, fmt.Errorf("enqueue %s: %w", key, err)
	case resp.Succeeded:
		rev = resp.Header.Revision
		return rev, rev, int(resp.Responses[0].GetResponseRange().Count), nil
	}
	own := resp.Responses[0].GetResponseRange().Kvs
	if len(own) == 0 && len(spec.Guard) > 0 {
		return 0, 0, 0, ErrGuard // the key is absent, so the guard failed
	}
	if len(own) == 0 {
		return 0, 0, 0, fmt.Errorf("%w: key %s vanished between two tries of its write", ErrLost, key)
	}
	rev = own[0].CreateRevision
	return rev, resp.Header.Revision, countAhead(resp.Responses[1].GetResponseRange().Kvs, rev), nil
}

// countAhead counts the keys created before rev.
func countAhead(kvs []*mvccpb.KeyValue, rev int64) int {
	n := 0
	for _, kv := range kvs {
		if kv.CreateRevision < rev {
			n++
		}
	}
	return n
}

// wait returns once fewer than spec.Slots keys are ahead of key, counting the deletes its
// hub dispatches; ErrLost when its own key or session goes first. It sends no RPC itself.
func (q *Queue) wait(ctx context.Context, sess *Session, spec Spec, key string, rev, seen int64, ahead int) error {
	w := newWaiter(key, rev, seen, ahead, q.prefix+spec.Ahead, spec.Slots)
	h := join(q.hubKey(), w)
	defer h.leave(w)
	for {
		h.mu.Lock()
		served, err := w.served, w.err
		h.mu.Unlock()
		switch {
		case served:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-w.wake:
		case <-sess.Done():
			return fmt.Errorf("%w: session expired while waiting", ErrLost)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// TryAcquire takes a hold only if it would be served at once, having written nothing
// otherwise. With spec.Slots <= 1 that is when no key is in spec.Ahead: one Txn, ErrLocked
// when it fails. With more slots it is when fewer than spec.Slots keys are there (see
// tryCounted): ErrNoPermits, after one read-only Txn, when they are all taken. Either way
// ErrGuard when spec.Guard fails.
func (q *Queue) TryAcquire(ctx context.Context, spec Spec) (*Hold, error) {
	return q.withSlot(ctx, spec.Kind, func(sess *Session, slot *slot) (*Hold, error) {
		if spec.Slots > 1 {
			return q.tryCounted(ctx, sess, spec, slot)
		}
		return q.try(ctx, sess, spec, slot)
	})
}

func (q *Queue) try(ctx context.Context, sess *Session, spec Spec, slot *slot) (*Hold, error) {
	key, aheadRange := slot.key(), q.prefix+spec.Ahead
	resp, err := commitWrite(ctx, q.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(aheadRange), "=", 0).WithPrefix()}, spec.Guard...)...).
			Then(clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease()))).
			// The key may be there already: see enqueue.
			Else(append([]clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(aheadRange, clientv3.WithFirstCreate()...)}, checkGuard(spec)...)...)
	})
	switch {
	case err != nil:
		return nil, q.tryFailed(ctx, key, err)
	case resp.Succeeded:
		return newHold(q.cli, sess, slot, resp.Header.Revision), nil
	}
	own, first := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(own) == 0 && !guardHeld(resp, 2) {
		return nil, ErrGuard
	}
	if len(own) == 0 {
		return nil, ErrLocked
	}
	if len(first) == 0 || first[0].CreateRevision >= own[0].CreateRevision {
		return newHold(q.cli, sess, slot, own[0].CreateRevision), nil
	}
	q.remove(ctx, key) // ours, but behind another: a try does not wait
	return nil, ErrLocked
}

// tryFailed removes the key of a try that failed or whose caller left (its Txn may have
// written the key), unless the lease, and with it any key, is gone, and returns err:
// ctx's error as it is, another wrapped.
func (q *Queue) tryFailed(ctx context.Context, key string, err error) error {
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		q.remove(ctx, key)
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("try %s: %w", key, err)
}

// remove deletes the key of a failed acquisition, on a detached context so that a
// cancelled ctx still cleans up. The key is this acquisition's alone, so a plain delete is
// safe; if etcd cannot be reached, the key goes when its lease does.
func (q *Queue) remove(ctx context.Context, key string) {
	dctx, cancel := detached(ctx)
	defer cancel()
	_, _ = q.cli.Delete(clientv3.WithRequireLeader(dctx), key)
}
