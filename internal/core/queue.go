package core

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
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
}

// NewQueue returns the queue of the name whose key prefix is prefix. It does no I/O.
func NewQueue(cli *clientv3.Client, sessions Sessions, prefix string) *Queue {
	return &Queue{cli: cli, sessions: sessions, prefix: prefix}
}

// Prefix is the key prefix of the queue's name.
func (q *Queue) Prefix() string { return q.prefix }

// Spec describes one kind of acquisition.
type Spec struct {
	Kind  string // sub-prefix of the acquisition's key under the name ("" for a mutex)
	Ahead string // sub-prefix whose earlier keys count against it ("" for every kind)
	Slots int    // it is served once fewer than Slots keys are ahead in Ahead
	Value string // stored in the key
}

// Acquire enqueues and waits until spec's predicate holds, then returns the hold. onKey, if
// not nil, learns the key before the wait. Uncontended it costs one Txn; a waiter adds one
// watch and, when revisions moved between its Txn and its watch, one Range; once the last
// predecessor's delete event arrives it returns with no further RPC. On failure, including
// ctx ending, it deletes its key before returning.
func (q *Queue) Acquire(ctx context.Context, spec Spec, onKey func(string)) (*Hold, error) {
	return q.withSlot(ctx, spec.Kind, func(sess *concurrency.Session, slot *slot) (*Hold, error) {
		key := slot.key()
		if onKey != nil {
			onKey(key)
		}
		rev, ahead, err := q.enqueue(ctx, sess, spec, key)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, err // nothing was written
		}
		if err == nil && len(ahead) >= spec.Slots {
			err = q.wait(ctx, sess, spec, key, rev, ahead)
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
func (q *Queue) withSlot(ctx context.Context, kind string, attempt func(*concurrency.Session, *slot) (*Hold, error)) (*Hold, error) {
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
		q.sessions.Expired(sess)
	}
}

// enqueue writes key once, whatever the retries, and returns its create revision and the
// keys ahead of it in spec.Ahead.
func (q *Queue) enqueue(ctx context.Context, sess *concurrency.Session, spec Spec, key string) (int64, map[string]struct{}, error) {
	aheadRange := q.prefix + spec.Ahead
	var b backoff
	for {
		resp, err := q.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
				clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease()))).
			// The key is there already (written by a try whose answer was lost, or left by a
			// cleanup that could not reach etcd): it is this slot's, so take its place.
			Else(clientv3.OpGet(key), clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithKeysOnly())).
			Commit()
		switch {
		case err == nil:
			return keysAhead(resp, key)
		case !transient(err) || ctx.Err() != nil:
			return 0, nil, fmt.Errorf("enqueue %s: %w", key, err)
		}
		if err := b.wait(ctx); err != nil {
			return 0, nil, err
		}
	}
}

func keysAhead(resp *clientv3.TxnResponse, key string) (int64, map[string]struct{}, error) {
	rev, kvs := resp.Header.Revision, resp.Responses[0].GetResponseRange().Kvs
	if !resp.Succeeded {
		own := resp.Responses[0].GetResponseRange().Kvs
		if len(own) == 0 {
			return 0, nil, fmt.Errorf("%w: key %s vanished between two tries of its write", ErrLost, key)
		}
		rev, kvs = own[0].CreateRevision, resp.Responses[1].GetResponseRange().Kvs
	}
	ahead := make(map[string]struct{}, len(kvs))
	for _, kv := range kvs {
		if kv.CreateRevision < rev {
			ahead[string(kv.Key)] = struct{}{}
		}
	}
	return rev, ahead, nil
}

// wait returns once fewer than spec.Slots keys are ahead, retrying its watch through
// leader changes until ctx ends; ErrLost when its own key or session goes first.
func (q *Queue) wait(ctx context.Context, sess *concurrency.Session, spec Spec, key string, rev int64, ahead map[string]struct{}) error {
	var b backoff
	for {
		err := q.watchAhead(ctx, sess, spec, key, rev, ahead)
		if err == nil || !transient(err) || ctx.Err() != nil {
			return err
		}
		if err := b.wait(ctx); err != nil {
			return err
		}
	}
}

func (q *Queue) watchAhead(ctx context.Context, sess *concurrency.Session, spec Spec, key string, rev int64, ahead map[string]struct{}) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	// From the present: a watch from a past revision waits for etcd's 100 ms resync loop.
	wch := q.cli.Watch(wctx, q.prefix, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	first := true
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				return q.watchEnded(ctx)
			}
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					// A watch the client resumed after a reconnect, from a revision since
					// compacted: a new watch from the present and a reread recover.
					return errWatchClosed
				}
				return fmt.Errorf("watch %s: %w", q.prefix, err)
			}
			if first && wr.Created {
				first = false
				if wr.Header.Revision > rev {
					// Deletes between our Txn and the watch's start are not in the stream.
					if err := q.reread(ctx, spec, key, rev, ahead); err != nil {
						return err
					}
				}
			}
			for _, ev := range wr.Events {
				if ev.Type != mvccpb.DELETE {
					continue
				}
				if k := string(ev.Kv.Key); k == key {
					return fmt.Errorf("%w: key %s deleted while waiting", ErrLost, key)
				} else {
					delete(ahead, k)
				}
			}
			if len(ahead) < spec.Slots {
				return nil
			}
		case <-sess.Done():
			return fmt.Errorf("%w: session expired while waiting", ErrLost)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watchEnded says why a watch channel closed: ctx, the client's closing (final), or
// something a new watch may get past.
func (q *Queue) watchEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := q.cli.Ctx().Err(); err != nil {
		return fmt.Errorf("etcd client closed: %w", err)
	}
	return errWatchClosed
}

// reread replaces ahead with the keys ahead now, and checks that key is still there.
func (q *Queue) reread(ctx context.Context, spec Spec, key string, rev int64, ahead map[string]struct{}) error {
	resp, err := q.cli.Get(ctx, q.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(rev))
	if err != nil {
		return fmt.Errorf("read keys ahead of %s: %w", key, err)
	}
	clear(ahead)
	own := false
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		switch {
		case k == key:
			own = true
		case kv.CreateRevision < rev && strings.HasPrefix(k, q.prefix+spec.Ahead):
			ahead[k] = struct{}{}
		}
	}
	if !own {
		return fmt.Errorf("%w: key %s deleted while waiting", ErrLost, key)
	}
	return nil
}

// TryAcquire takes a hold only if no key is in spec.Ahead (spec.Slots is not consulted);
// otherwise it returns ErrLocked having written nothing. One Txn.
func (q *Queue) TryAcquire(ctx context.Context, spec Spec) (*Hold, error) {
	return q.withSlot(ctx, spec.Kind, func(sess *concurrency.Session, slot *slot) (*Hold, error) {
		return q.try(ctx, sess, spec, slot)
	})
}

func (q *Queue) try(ctx context.Context, sess *concurrency.Session, spec Spec, slot *slot) (*Hold, error) {
	key, aheadRange := slot.key(), q.prefix+spec.Ahead
	var b backoff
	for {
		resp, err := q.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(aheadRange), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(key, spec.Value, clientv3.WithLease(sess.Lease()))).
			// The key may be there already: see enqueue.
			Else(clientv3.OpGet(key), clientv3.OpGet(aheadRange, clientv3.WithFirstCreate()...)).
			Commit()
		switch {
		case err == nil && resp.Succeeded:
			return newHold(q.cli, sess, slot, resp.Header.Revision), nil
		case err == nil:
			own, first := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
			if len(own) == 0 {
				return nil, ErrLocked
			}
			if len(first) == 0 || first[0].CreateRevision >= own[0].CreateRevision {
				return newHold(q.cli, sess, slot, own[0].CreateRevision), nil
			}
			q.remove(ctx, key) // ours, but behind another: a try does not wait
			return nil, ErrLocked
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return nil, err
		case !transient(err) || ctx.Err() != nil:
			q.remove(ctx, key)
			return nil, fmt.Errorf("try %s: %w", key, err)
		}
		if err := b.wait(ctx); err != nil {
			q.remove(ctx, key)
			return nil, err
		}
	}
}

// remove deletes the key of a failed acquisition, on a detached context so that a
// cancelled ctx still cleans up. The key is this acquisition's alone, so a plain delete is
// safe; if etcd cannot be reached, the key goes when its lease does.
func (q *Queue) remove(ctx context.Context, key string) {
	dctx, cancel := detached(ctx)
	defer cancel()
	_, _ = q.cli.Delete(dctx, key)
}
