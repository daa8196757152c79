package core

import (
	"context"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An exclusive acquisition (one slot, keys of one unit: a mutex, a reader or a writer of an
// RWMutex, a candidate) is served once no key of its Ahead range was created before its
// own. Such a waiter watches only the key just ahead of it, and its own key, on the
// client's keyWatch: a release then reaches the one client whose waiter is next, where a
// watch of the whole name (the hub, which weighted and multi-name waits still use) reaches
// every client waiting on the name, each event with the deleted key's previous version,
// which etcd reads from its backend once per watcher.
//
// When the key ahead goes, the waiter reads, at that delete's revision, its own key and the
// last key still ahead of it: none, it is served; else it watches that one. The read is
// serializable at a revision the client has seen, so the member it reaches answers it
// without a round to the leader; a member that has not applied that revision yet (or one
// that compacted it) is asked again, linearizably.
//
// A watch served by a member that lags may report deletes the waiter's reads already
// reflect, or of an older key of the same name (a slot's key is reused): the waiter goes by
// revisions, and takes a delete at or below the view it has as no news.
//
// The watches are created from the present, so that etcd serves them from its synced
// watchers at once (a watch from a past revision waits for etcd's resync, up to 100 ms);
// when revisions moved between the waiter's last read and the watches' creation, one more
// read covers the gap. A stream that fails, or a watch etcd cancels, is a gap too: the
// waiter watches again and reads.

// waitsNext reports whether spec's waiters wait for the key just ahead (see above): an
// exclusive spec, on a client whose holds the keyWatch watches (see ownWatch).
func (q *Queue) waitsNext(spec Spec) bool { return !spec.weighted() && ownWatch(q.cli) }

// nextRead is the op that reads the last key of aheadRange created before revision rev.
func nextRead(aheadRange string, rev int64, opts ...clientv3.OpOption) clientv3.Op {
	return clientv3.OpGet(aheadRange, append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithMaxCreateRev(rev - 1),
		clientv3.WithLimit(1)}, opts...)...)
}

// noteKind is what the keyWatch tells a waiter of one of its watches.
type noteKind int

const (
	noteCreated     noteKind = iota // the watch is in place from rev on
	noteDeleted                     // the key was deleted at rev
	noteInterrupted                 // the watch is gone (its stream failed, or etcd cancelled it)
)

type keyNote struct {
	w    *keyWait
	kind noteKind
	rev  int64
}

// A keyWait is one key watched on the keyWatch for a waiting acquisition.
type keyWait struct {
	id     int64
	key    string
	to     *nextWaiter
	stream *keyStream // the stream its create request went to; nil until it is sent
}

// nextWaiter gathers what the keyWatch tells a waiter of its watches. notify never blocks.
type nextWaiter struct {
	mu    sync.Mutex
	notes []keyNote
	wake  chan struct{}
}

func (n *nextWaiter) notify(kn keyNote) {
	n.mu.Lock()
	n.notes = append(n.notes, kn)
	n.mu.Unlock()
	signal(n.wake)
}

func (n *nextWaiter) take() []keyNote {
	n.mu.Lock()
	defer n.mu.Unlock()
	notes := n.notes
	n.notes = nil
	return notes
}

// aheadView is what a read found: whether the waiter's key is still there, and the last key
// ahead of it (nil: none), as of revision at.
type aheadView struct {
	own  bool
	last *mvccpb.KeyValue
	at   int64
}

// waitNext returns once no key of spec's Ahead range created before key's revision e.rev is
// left; ErrLost when its own key or session goes first.
func (q *Queue) waitNext(ctx context.Context, sess *Session, spec Spec, key string, e enqueued) error {
	kw := stateOf(q.cli).keys
	n := &nextWaiter{wake: make(chan struct{}, 1)}
	aheadRange := q.prefix + spec.Ahead
	v := aheadView{own: true, last: e.last, at: e.snap}
	var own, last *keyWait
	var ownAt, lastAt int64 // the revisions the watches were created at; 0 until then
	defer func() {
		kw.unwatch(own)
		kw.unwatch(last)
	}()
	// take renews the view from a read; it reports whether the wait is over, and how.
	take := func(nv aheadView) (bool, error) {
		switch {
		case !nv.own:
			return true, fmt.Errorf("%w: key %s deleted while waiting", ErrLost, key)
		case nv.last == nil:
			return true, nil
		}
		if string(nv.last.Key) != string(v.last.Key) || nv.last.CreateRevision != v.last.CreateRevision {
			kw.unwatch(last)
			last, lastAt = nil, 0
		}
		v = nv
		return false, nil
	}
	for {
		if v.last == nil {
			return nil
		}
		if err := q.cli.Ctx().Err(); err != nil {
			return fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		}
		if own == nil {
			own, ownAt = kw.watchKey(key, n), 0
		}
		if last == nil {
			last, lastAt = kw.watchKey(string(v.last.Key), n), 0
		}
		if at := max(ownAt, lastAt); ownAt > 0 && lastAt > 0 && at > v.at {
			// Revisions moved between the view and the watches: see what they did.
			nv, err := q.readAhead(ctx, key, e.rev, aheadRange, at)
			if err != nil {
				return err
			}
			if done, err := take(nv); done {
				return err
			}
			continue
		}
		select {
		case <-n.wake:
		case <-sess.Done():
			return sess.lostErr()
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, note := range n.take() {
			switch {
			case note.w == own && note.kind == noteCreated:
				ownAt = note.rev
			case note.w == own && note.kind == noteDeleted && note.rev > e.rev:
				return fmt.Errorf("%w: key %s deleted while waiting", ErrLost, key)
			case note.w == own && note.kind == noteDeleted:
				// A key of this name that went before this one was created: a watch on a
				// member that lags replays it.
			case note.w == own:
				own = nil
			case note.w != last: // a watch the waiter has let go
			case note.kind == noteCreated:
				lastAt = note.rev
			case note.kind == noteDeleted && note.rev > v.at: // else already read (or, on a lagging member, an older key of the name)
				nv, err := q.readAhead(ctx, key, e.rev, aheadRange, note.rev)
				if err != nil {
					return err
				}
				if done, err := take(nv); done {
					return err
				}
			case note.kind == noteInterrupted:
				last = nil
			}
		}
	}
}

// readAhead reads key and the last key of aheadRange created before rev, at revision at:
// serializable, from whichever member the client asks, which has applied at (the client saw
// it); should that member not have (or have compacted it), linearizably, retried through
// leader changes until ctx ends.
func (q *Queue) readAhead(ctx context.Context, key string, rev int64, aheadRange string, at int64) (aheadView, error) {
	ops := func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{
			clientv3.OpGet(key, append([]clientv3.OpOption{clientv3.WithKeysOnly()}, opts...)...),
			nextRead(aheadRange, rev, opts...),
		}
	}
	view := func(resp *clientv3.TxnResponse, at int64) aheadView {
		own := resp.Responses[0].GetResponseRange().Kvs
		v := aheadView{own: len(own) == 1 && own[0].CreateRevision == rev, at: at}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			v.last = kvs[0]
		}
		return v
	}
	tctx, cancel := context.WithTimeout(ctx, tryTimeout)
	resp, err := q.cli.Txn(tctx).Then(ops(clientv3.WithRev(at), clientv3.WithSerializable())...).Commit()
	cancel()
	if err == nil {
		return view(resp, at), nil
	}
	if ctx.Err() != nil {
		return aheadView{}, ctx.Err()
	}
	var sent int64
	resp, err = retry(ctx, func() (*clientv3.TxnResponse, error) {
		sent = clockOf(q.cli).now()
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops()...).Commit()
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return aheadView{}, ctx.Err()
	case err != nil:
		return aheadView{}, fmt.Errorf("read what is ahead of %s: %w", key, err)
	}
	if rw := clockOf(q.cli).linear(resp.Header, sent); rw != nil {
		rewind(q.cli, rw)
		return aheadView{}, fmt.Errorf("%w: %w", ErrLost, rw)
	}
	return view(resp, resp.Header.Revision), nil
}
