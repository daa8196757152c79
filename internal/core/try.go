package core

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrGuard: an acquisition's Spec.Guard failed, so it wrote nothing. The caller reads what
// the guard compares and decides (a semaphore: record its limit, or ErrLimitMismatch).
var ErrGuard = errors.New("etcdsync: guard failed")

// countedTries is how often a try with several slots reads the count again after a key
// arrived between its read and its write, before it gives up as if every slot were taken.
const countedTries = 3

// TryAcquire takes a hold only if it would be served at once, having written nothing
// otherwise. With spec.slots() <= 1 that is when no key is in spec.Ahead: one Txn, ErrLocked
// when it fails. With more slots it is when fewer than spec.slots() keys are there (see
// tryCounted): ErrNoPermits, after one read-only Txn, when they are all taken. Either way
// ErrGuard when spec.Guard fails.
func (q *Queue) TryAcquire(ctx context.Context, spec Spec) (*Hold, error) {
	return q.withSlot(ctx, spec.keyKind(), func(sess *Session, sl *slot) (*Hold, error) {
		if spec.slots() > 1 {
			return q.tryCounted(ctx, sess, spec, sl)
		}
		return q.try(ctx, sess, spec, sl)
	})
}

func (q *Queue) try(ctx context.Context, sess *Session, spec Spec, sl *slot) (*Hold, error) {
	key, aheadRange := sl.key(), q.prefix+spec.Ahead
	res, err := commitWrite(ctx, q.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(aheadRange), "=", 0).WithPrefix()}, spec.Guard...)...).
			Then(clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease()))).
			// The key may be there already: see enqueue.
			Else(append([]clientv3.Op{clientv3.OpGet(key),
				clientv3.OpGet(aheadRange, clientv3.WithFirstCreate()...)}, checkGuard(spec)...)...)
	})
	if res.unknown {
		q.sessions.Retire(sess) // see Queue.abandon
	}
	resp := res.resp
	switch {
	case resp == nil:
		q.abandon(ctx, sl, 0, res.unknown)
		return nil, tryError(ctx, key, err)
	case resp.Succeeded:
		return q.grant(ctx, sess, sl, resp.Header.Revision, err)
	}
	own, first := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(own) == 0 && !guardHeld(resp, 2):
		q.abandon(ctx, sl, 0, res.unknown)
		return nil, ErrGuard
	case len(own) == 0:
		q.abandon(ctx, sl, 0, res.unknown)
		return nil, ErrLocked
	case len(first) == 0 || first[0].CreateRevision >= own[0].CreateRevision:
		if err == nil {
			err = q.takeOver(ctx, sess, own[0], spec.Value)
		}
		return q.grant(ctx, sess, sl, own[0].CreateRevision, err)
	}
	q.abandon(ctx, sl, own[0].CreateRevision, false) // ours, but behind another: a try does not wait
	return nil, ErrLocked
}

// tryError is the error of a try that failed: ctx's error as it is, another wrapped.
func tryError(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("try %s: %w", key, err)
}

// checkGuard is an Else op that evaluates spec.Guard, for guardHeld; none without a guard.
func checkGuard(spec Spec) []clientv3.Op {
	if len(spec.Guard) == 0 {
		return nil
	}
	return []clientv3.Op{clientv3.OpTxn(spec.Guard, nil, nil)}
}

// guardHeld reports whether the checkGuard op at index i of resp's ops succeeded; true when
// there is none (no guard).
func guardHeld(resp *clientv3.TxnResponse, i int) bool {
	if i >= len(resp.Responses) {
		return true
	}
	return resp.Responses[i].GetResponseTxn().GetSucceeded()
}

// tryCounted is TryAcquire for spec.slots() > 1: a hold only if fewer than spec.slots() keys
// (units, when weighted) are in spec.Ahead, so that it is served at once and jumps no
// waiter. With capacity C an acquisition of weight n is served below C-n+1 units ahead; a
// waiter of weight m waits behind at least C-m+1, so while there is one the range holds
// more than C units, and no try's count is under its threshold.
//
// A Txn cannot compare a count, so it reads first and writes on condition: one read-only
// Txn counts the range at revision R (and checks the guard); if a slot is free, a second
// puts the key only if no key of the range was written after R ("ModRevision < R+1" over a
// prefix holds for every key in it). Deletes since R only free slots. A key that arrived
// since R makes it read again, up to countedTries times, then give up with ErrNoPermits.
// When full it costs one read and writes nothing; otherwise a read and a Txn.
func (q *Queue) tryCounted(ctx context.Context, sess *Session, spec Spec, sl *slot) (*Hold, error) {
	for range countedTries {
		n, rev, err := q.countKeys(ctx, spec)
		if err == nil && n >= spec.slots() {
			err = ErrNoPermits
		}
		if err != nil {
			sl.free()
			return nil, err
		}
		h, err := q.putIfUnchanged(ctx, sess, spec, sl, rev)
		if !errors.Is(err, errMoved) {
			return h, err
		}
	}
	sl.free()
	return nil, fmt.Errorf("%w: keys kept arriving between the count and the write", ErrNoPermits)
}

var errMoved = errors.New("etcdsync: a key arrived since the count")

// countKeys counts the keys in spec.Ahead, linearizably, under spec.Guard (ErrGuard if it
// fails), and returns the count with the revision it reflects. One read-only Txn, retried
// through leader changes.
func (q *Queue) countKeys(ctx context.Context, spec Spec) (n int, rev int64, err error) {
	w := weigherOf(q, spec)
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(spec.Guard...).
			Then(w.reads(q.prefix + spec.Ahead)...).
			Commit()
	})
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("count %s: %w", q.prefix+spec.Ahead, err)
	case !resp.Succeeded:
		return 0, 0, ErrGuard
	}
	return w.weight(resp.Responses), resp.Header.Revision, nil
}

// putIfUnchanged writes the slot's key if no key of spec.Ahead was written after rev and
// the guard holds: then fewer than spec.slots() keys are ahead of it, as counted at rev.
// errMoved says a key arrived meanwhile (the slot is still claimed, nothing written). A key
// of the slot already there (a try of this call whose answer was lost) is taken over if it
// is served, else removed.
func (q *Queue) putIfUnchanged(ctx context.Context, sess *Session, spec Spec, sl *slot, rev int64) (*Hold, error) {
	key, aheadRange := sl.key(), q.prefix+spec.Ahead
	cmps := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.ModRevision(aheadRange), "<", rev+1).WithPrefix(),
	}, spec.Guard...)
	res, err := commitWrite(ctx, q.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(cmps...).
			Then(clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease()))).
			Else(append([]clientv3.Op{clientv3.OpGet(key),
				clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithKeysOnly())}, checkGuard(spec)...)...)
	})
	if res.unknown {
		q.sessions.Retire(sess) // see Queue.abandon
	}
	resp := res.resp
	switch {
	case resp == nil:
		q.abandon(ctx, sl, 0, res.unknown)
		return nil, tryError(ctx, key, err)
	case resp.Succeeded:
		return q.grant(ctx, sess, sl, resp.Header.Revision, err)
	}
	own := resp.Responses[0].GetResponseRange().Kvs
	switch {
	case len(own) == 1 && weigherOf(q, spec).ahead(resp.Responses[1].GetResponseRange().Kvs, own[0].CreateRevision) < spec.slots():
		if err == nil {
			err = q.takeOver(ctx, sess, own[0], spec.Value)
		}
		return q.grant(ctx, sess, sl, own[0].CreateRevision, err)
	case len(own) == 1:
		q.abandon(ctx, sl, own[0].CreateRevision, false) // ours, but not served: a try does not wait
		return nil, ErrNoPermits
	case !guardHeld(resp, 2):
		q.abandon(ctx, sl, 0, res.unknown)
		return nil, ErrGuard
	case err != nil:
		q.abandon(ctx, sl, 0, res.unknown)
		return nil, err
	case res.unknown:
		// A try got no answer and may still be applied: count no more on this slot.
		q.abandon(ctx, sl, 0, true)
		return nil, fmt.Errorf("%w: a try of %s got no answer", ErrNoPermits, key)
	}
	return nil, errMoved
}
