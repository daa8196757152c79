package core

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type holdState int

const (
	held holdState = iota
	releasing
	lost
	released
)

// Hold is one granted acquisition: a key at a create revision.
//
// From the first call to Done or Err on, a goroutine watches the key (from the revision after
// its creation, so no delete is missed whenever it starts) and the session, so that Done
// closes and Err turns ErrLost as soon as etcd says the key is gone; Release stops it before
// returning. The watch is started on demand because it costs a fifth of an uncontended
// lock+unlock cycle, which a holder that never asks should not pay; a loss is still reported
// by Release, whose fenced delete then fails.
//
// A nil *Hold stands for no hold, so that a public handle can pass on the methods of what
// it holds, or of nothing: Token is 0, Done is Closed, Err is ErrNotLocked, and
// Queue.IsOwner gives a compare that never succeeds.
type Hold struct {
	cli  *clientv3.Client
	sess *Session
	slot *slot
	key  string
	rev  int64
	done chan struct{}

	mu          sync.Mutex
	state       holdState
	err         error
	sawDelete   bool               // the key vanished while a release was under way
	tried       bool               // a release's delete got no answer: etcd may have applied it
	settled     bool               // ... and it was found applied: the next Release reports the end
	stopMonitor context.CancelFunc // nil until the monitor starts
	monitorDone chan struct{}
	onEnd       []func(error)
}

func newHold(cli *clientv3.Client, sess *Session, slot *slot, rev int64) *Hold {
	return &Hold{cli: cli, sess: sess, slot: slot, key: slot.key(), rev: rev, done: make(chan struct{})}
}

// watch starts the monitor unless it runs already or the hold is ending.
func (h *Hold) watch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopMonitor != nil || h.state != held {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stopMonitor, h.monitorDone = cancel, make(chan struct{})
	go h.monitor(ctx)
}

// OnEnd arranges for f to be called once when the hold ends, with its final error (nil
// after a clean release, ErrLost after a loss); at once if it has ended. It starts the
// watch, as Done does. f runs under the hold's lock: it must be quick and must not call
// the Hold.
func (h *Hold) OnEnd(f func(error)) {
	h.watch()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == lost || h.state == released {
		f(h.err)
		return
	}
	h.onEnd = append(h.onEnd, f)
}

// Live reports, without starting the watch or sending an RPC, that the hold has not ended
// and its session is not known to be dead.
func (h *Hold) Live() bool {
	select {
	case <-h.sess.Done():
		return false
	default:
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == held
}

// Check reads the key, linearizably: alive means it is still the one the hold created, so
// it has existed without a break from the grant until some moment after Check was called.
// If it is not, the hold is lost (Done closes). One Range, retried through leader changes
// until ctx ends.
func (h *Hold) Check(ctx context.Context) (alive bool, err error) {
	resp, err := retry(ctx, func() (*clientv3.GetResponse, error) {
		return h.cli.Get(clientv3.WithRequireLeader(ctx), h.key, clientv3.WithKeysOnly())
	})
	if err != nil {
		return false, fmt.Errorf("check %s: %w", h.key, err)
	}
	alive = len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == h.rev
	if !alive {
		h.gone(ctx)
	}
	return alive, nil
}

// gone ends the hold whose key was found missing: as lost, unless a release whose answer
// never came may have deleted it and the lease lives, so that it was that release's.
func (h *Hold) gone(ctx context.Context) {
	h.mu.Lock()
	ours := h.tried && h.state == held
	h.mu.Unlock()
	if ours && h.leaseAlive(ctx) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.state == held {
			h.end(released, nil)
			h.settled = true
		}
		return
	}
	h.lose()
}

// Key is the hold's key.
func (h *Hold) Key() string { return h.key }

// Token is the hold's create revision: its fencing token.
func (h *Hold) Token() int64 {
	if h == nil {
		return 0
	}
	return h.rev
}

// Done is closed when the hold ends, by release or by loss. The first call starts the watch.
// A session known to have ended is reported at once, also on the first call.
func (h *Hold) Done() <-chan struct{} {
	if h == nil {
		return Closed
	}
	h.watch()
	if h.sessionEnded() {
		h.sessionLost()
	}
	return h.done
}

// Err is nil while the hold lasts or after a clean release, ErrLost after a loss. The first
// call starts the watch; a session known to be dead is reported at once.
func (h *Hold) Err() error {
	if h == nil {
		return ErrNotLocked
	}
	h.watch()
	if h.sessionEnded() {
		h.sessionLost()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Closed is a closed channel: the Done of no hold.
var Closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// NeverOwner is a Txn compare on key that never succeeds (no key has a negative create
// revision): the IsOwner of no hold. key should lie where the caller may read.
func NeverOwner(key string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(key), "<", 0)
}

// IsOwner is h's IsOwner, or NeverOwner under the queue's prefix for no hold (nil).
func (q *Queue) IsOwner(h *Hold) clientv3.Cmp {
	if h == nil {
		return NeverOwner(q.prefix)
	}
	return h.IsOwner()
}

// IsOwner is a Txn compare that holds only while the hold's key is the one it created.
func (h *Hold) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)
}

// end closes done once, with err as the hold's final error, and frees the key's slot: the
// key is gone (or, after a loss, no longer this hold's), and a late Release of this hold
// compares the create revision, so it cannot touch the slot's next key.
func (h *Hold) end(state holdState, err error) {
	if h.state == lost || h.state == released {
		h.state = state
		return
	}
	h.state, h.err = state, err
	close(h.done)
	h.slot.free()
	for _, f := range h.onEnd {
		f(err)
	}
	h.onEnd = nil
}

// lose records that the key or the session is gone. During a release the delete seen may be
// the release's own, so it is only noted.
func (h *Hold) lose() {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch h.state {
	case held:
		h.end(lost, ErrLost)
	case releasing:
		h.sawDelete = true
	}
}

// monitor watches the key from the revision after its creation, so no delete is missed
// whenever the watch starts; it re-watches through leader changes until stopped.
//
// The session's end interrupts whatever the monitor waits for, also a Watch call, which
// blocks until etcd answers: a session that ends at its local deadline is the news that
// etcd cannot be reached, and the hold must end then, not once etcd answers again.
func (h *Hold) monitor(ctx context.Context) {
	defer close(h.monitorDone)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(h.sess.ctx, cancel)()
	from := h.rev + 1
	var b backoff
	for {
		next, gone := h.watchKey(ctx, from)
		if gone {
			h.gone(ctx)
			return
		}
		if h.sessionEnded() {
			h.sessionLost()
			return
		}
		if ctx.Err() != nil {
			return
		}
		from = next
		if b.wait(ctx) != nil {
			return
		}
	}
}

// sessionLost ends the hold as lost because its session ended: its lease is gone or, at
// the local deadline, may be. A release under way decides for itself.
func (h *Hold) sessionLost() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held {
		h.end(lost, ErrLost)
	}
}

// sessionEnded reports whether the hold's session has ended: its lease is gone, or may be.
func (h *Hold) sessionEnded() bool {
	select {
	case <-h.sess.Done():
		return true
	case <-h.sess.ctx.Done():
		return true
	default:
		return false
	}
}

// watchKey returns when the watch fails (with the revision to watch from next), the key is
// gone (gone), the session ends, or ctx ends.
func (h *Hold) watchKey(ctx context.Context, from int64) (next int64, gone bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := h.cli.Watch(wctx, h.key, clientv3.WithRev(from), clientv3.WithFilterPut())
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				return from, false
			}
			if errors.Is(wr.Err(), rpctypes.ErrCompacted) {
				return h.checkKey(ctx, from)
			}
			if wr.Err() != nil {
				return from, false
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return from, true
				}
			}
			from = wr.Header.Revision + 1
		case <-h.sess.Done():
			return from, false // see monitor
		case <-h.cli.Ctx().Done():
			return from, true // nothing can keep or release the key through a closed client
		case <-ctx.Done():
			return from, false
		}
	}
}

// checkKey reads the key after a compaction took the history the watch needed.
func (h *Hold) checkKey(ctx context.Context, from int64) (next int64, gone bool) {
	resp, err := h.cli.Get(clientv3.WithRequireLeader(ctx), h.key)
	if err != nil {
		return from, false
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
		return from, true
	}
	return resp.Header.Revision + 1, false
}

// Release deletes the key if it is still this hold's (a compare on its create revision, so
// a late or retried release never deletes a newer hold's key) and ends the hold. One Txn,
// retried through leader changes until ctx ends.
//
// ended is true for exactly one call: the one that ended the hold, with a nil error or
// ErrLost if the hold was lost first. Another call, during or after it, gets ErrNotLocked.
// When a call's delete got no answer and the hold's watch or Check then found it applied,
// the next call is the one that reports the end.
// When the Txn cannot be done, the hold stays and the error says why.
func (h *Hold) Release(ctx context.Context) (ended bool, err error) {
	h.mu.Lock()
	prev := h.state
	if prev == released && h.settled {
		// An earlier call's delete, which got no answer, was found applied (see gone).
		h.settled = false
		h.mu.Unlock()
		return true, nil
	}
	if prev == releasing || prev == released {
		h.mu.Unlock()
		return false, ErrNotLocked
	}
	if prev == held {
		h.state = releasing
	}
	h.mu.Unlock()

	deleted, err := h.deleteFenced(ctx)
	if err != nil {
		h.mu.Lock()
		gone := h.sawDelete && prev == held
		h.mu.Unlock()
		if gone {
			// The key went while the delete got no answer (ctx ended, etcd out of reach):
			// if the lease lives, the delete was this release's, which did happen.
			dctx, cancel := detached(ctx)
			deleted = h.leaseAlive(dctx)
			cancel()
			err = nil
		}
	}
	if err != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if prev == held {
			h.state = held
		}
		return false, fmt.Errorf("release %s: %w", h.key, err)
	}
	h.mu.Lock()
	stop, monitorDone := h.stopMonitor, h.monitorDone
	h.mu.Unlock()
	if stop != nil {
		stop()
		<-monitorDone // without h.mu, which the monitor's lose() takes
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if prev == lost || !deleted {
		h.end(released, ErrLost)
		return true, ErrLost
	}
	h.end(released, nil)
	return true, nil
}

// deleteFenced deletes the key if it is still the hold's. A try that got no answer may have
// been applied, also one of an earlier Release call (tried): a later compare that fails
// then asks whether the lease lives.
func (h *Hold) deleteFenced(ctx context.Context) (deleted bool, err error) {
	h.mu.Lock()
	ambiguous := h.tried
	h.mu.Unlock()
	var b backoff
	for {
		resp, err := h.cli.Txn(clientv3.WithRequireLeader(ctx)).If(h.IsOwner()).Then(clientv3.OpDelete(h.key)).Commit()
		if err != nil {
			h.mu.Lock()
			h.tried = true
			h.mu.Unlock()
		}
		if err == nil {
			if resp.Succeeded || !ambiguous {
				return resp.Succeeded, nil
			}
			// A try whose answer was lost may have deleted the key, or the key went with its
			// lease meanwhile (the holder was cut off for the TTL): only the former is a release.
			return h.leaseAlive(ctx), nil
		}
		if !transient(err) || ctx.Err() != nil {
			return false, err
		}
		ambiguous = true
		if err := b.wait(ctx); err != nil {
			return false, err
		}
	}
}

// leaseAlive reports whether the hold's lease is alive, so that its key cannot have gone with
// it. If etcd cannot say, it reports false: a release is then reported as a loss, never a
// loss as a release.
func (h *Hold) leaseAlive(ctx context.Context) bool {
	resp, err := retry(ctx, func() (*clientv3.LeaseTimeToLiveResponse, error) {
		return h.cli.TimeToLive(clientv3.WithRequireLeader(ctx), h.sess.Lease())
	})
	return err == nil && resp.TTL > 0
}
