package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// holdState is where a hold is in its life.
type holdState uint8

const (
	held      holdState = iota // granted and not ending
	releasing                  // a Release's fenced delete is under way
	lost                       // ended by a loss that no Release has reported yet
	over                       // ended: released, or lost and reported by a Release
)

// Hold is one granted acquisition: a key at a create revision.
//
// From the first call to Done or Err on, the key is watched (keywatch.go), from the
// revision after its creation so that no delete is missed whenever the watch starts, and so
// is the session, so that Done closes and Err turns ErrLost as soon as etcd says the key is
// gone or the session ends. The watch is one of many on the client's one watch stream: a
// watched hold costs no goroutine. It is started on demand because it costs an RPC's worth
// of work, which a holder that never asks should not pay; a loss is still reported by
// Release, whose fenced delete then fails.
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

	mu     sync.Mutex
	state  holdState
	keyed  bool // its key is watched on the client's keyWatch
	ending      // its final error: nil after a clean release, ErrLost after a loss
	// seen is a loss the monitor saw while a release was under way, for that release to
	// weigh (the key it saw go may be the release's own); cleared by every release.
	seen    error
	mon     *monitor     // the watch of a hold on a client with a wrapped KV or Watcher
	metrics *holdMetrics // nil unless counted: see Telemetry.Held
	group   *Group       // the Group it is a member of, which is what is counted; nil for none
	timer   *time.Timer  // its maximum hold's (life.go); nil for none
	mod     int64        // the revision of its last change of mode (mode.go); 0 before one
	// capacity is the capacity it was served under when a change of it was heard while it
	// waited (a semaphore's SetLimit); 0: its spec's. Set before the Hold is handed out.
	capacity int
}

func newHold(cli *clientv3.Client, sess *Session, slot *slot, rev int64) *Hold {
	return &Hold{cli: cli, sess: sess, slot: slot, key: slot.key(), rev: rev, ending: ending{done: make(chan struct{})}}
}

// Key is the hold's key; "" for no hold.
func (h *Hold) Key() string {
	if h == nil {
		return ""
	}
	return h.key
}

// Capacity is the capacity the hold was served under, when it heard of a change while it
// waited; 0 when it was served under its spec's.
func (h *Hold) Capacity() int {
	if h == nil {
		return 0
	}
	return h.capacity
}

// Token is the hold's create revision: its fencing token; 0 for no hold.
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
	h.checkSession()
	return h.done
}

// Err is nil while the hold lasts or after a clean release, ErrLost after a loss. The first
// call starts the watch; a session known to be dead is reported at once.
func (h *Hold) Err() error {
	if h == nil {
		return ErrNotLocked
	}
	h.watch()
	h.checkSession()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Live reports, without starting the watch or sending an RPC, that the hold has not ended
// and its session is not known to be dead.
func (h *Hold) Live() bool {
	if h == nil || h.sess.ended() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == held
}

// OnEnd arranges for f to be called once when the hold ends, with its final error (nil
// after a clean release, ErrLost after a loss); at once if it has ended. It starts the
// watch, as Done does. f runs under the hold's lock: it must be quick and must not call
// the Hold.
func (h *Hold) OnEnd(f func(error)) {
	h.watch()
	h.checkSession()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addOnEnd(f)
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

// end ends the hold in state (lost or over) with err as its final error: closes done, frees
// the key's slot (the key is gone, or no longer this hold's, so the slot's next key is
// safe from a late delete of this hold's: every delete is fenced on its create revision),
// runs the OnEnd callbacks and stops the monitor. A lost hold moves on to over when a
// Release reports it. Under h.mu.
func (h *Hold) end(state holdState, err error) { h.endWith(state, err, !keyMayRemain(err)) }

// endWith is end, which frees the slot only if free (else its key may still be there).
func (h *Hold) endWith(state holdState, err error, free bool) {
	switch h.state {
	case over:
		return
	case lost:
		h.state = state
		return
	}
	h.state = state
	h.recordEnd(err)
	if h.timer != nil {
		h.timer.Stop()
	}
	if free {
		h.slot.free()
	}
	h.finish(err)
	h.unwatch()
}

// ending is how a hold or a Group ends, once: its Done channel closes, its final error is
// kept, its OnEnd callbacks run. Guarded by its owner's mutex.
type ending struct {
	done  chan struct{} // closed once ended
	err   error         // the final error once ended (a Group records its first loss before)
	onEnd []func(error)
}

// ended reports whether it has ended.
func (e *ending) ended() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// addOnEnd has f called with the final error when it ends; at once if it has.
func (e *ending) addOnEnd(f func(error)) {
	if e.ended() {
		f(e.err)
		return
	}
	e.onEnd = append(e.onEnd, f)
}

// finish ends it with err: closes done and runs the callbacks. Once.
func (e *ending) finish(err error) {
	e.err = err
	close(e.done)
	for _, f := range e.onEnd {
		f(err)
	}
	e.onEnd = nil
}

// observe records a loss: it ends a hold that is held; during a release, the release weighs
// it (see Release).
func (h *Hold) observe(loss error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch h.state {
	case held:
		h.end(lost, loss)
	case releasing:
		if h.seen == nil {
			h.seen = loss
		}
	}
}

// checkSession ends the hold as lost if its session is known to have ended.
func (h *Hold) checkSession() {
	if err := h.sess.lostErr(); err != nil {
		h.observe(err)
	}
}

// Check reads the key, linearizably: alive means it is still the one the hold created, so
// it has existed without a break from the grant until some moment after Check was called.
// If it is not, the hold is lost (Done closes). One Range, retried through leader changes
// until ctx ends.
func (h *Hold) Check(ctx context.Context) (alive bool, err error) {
	sent := clockOf(h.cli).now()
	resp, err := retry(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return h.cli.Get(clientv3.WithRequireLeader(ctx), h.key, clientv3.WithKeysOnly())
	})
	if err != nil {
		return false, fmt.Errorf("check %s: %w", h.key, err)
	}
	if rw := clockOf(h.cli).linear(resp.Header, sent); rw != nil {
		rewind(h.cli, rw)
		h.checkSession()
		return false, nil
	}
	alive = len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == h.rev
	if !alive {
		h.observe(h.goneErr(ctx))
		h.settleLoss()
	}
	return alive, nil
}

// errKeyDeleted is why a hold whose key is no longer the one it created was lost.
var errKeyDeleted = errors.New("deleted, or gone with its lease")

// errKeyGone is the loss of a hold whose key is no longer the one it created.
func errKeyGone(key string) error {
	return fmt.Errorf("%w: key %s %w", ErrLost, key, errKeyDeleted)
}

// errUnwatchable is the loss of a hold whose key etcd refuses for good to read (a
// permission revoked): a key that cannot be watched cannot tell of its loss. The key may
// still be the hold's, so its release still deletes it (see release).
func errUnwatchable(key string, err error) error {
	return fmt.Errorf("%w: key %s %w: %w", ErrLost, key, errUnwatched, err)
}

var errUnwatched = errors.New("cannot be watched")

// Put writes value into the hold's key, bound to the same lease, only while the key is
// still the one the hold created (IsOwner): a hold that was lost writes nothing. It reports
// whether it wrote. One Txn, retried through leader changes until ctx ends; a retry of a put
// whose answer was lost writes the same value again, which changes only the key's revision.
func (h *Hold) Put(ctx context.Context, value string) (written bool, err error) {
	resp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return h.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(h.IsOwner()).
			Then(clientv3.OpPut(h.key, value, clientv3.WithLease(h.sess.Lease()))).
			Commit()
	})
	if err != nil {
		return false, fmt.Errorf("put %s: %w", h.key, err)
	}
	return resp.Succeeded, nil
}

// Release deletes the key if it is still this hold's (a compare on its create revision, so
// a late or retried release never deletes a newer hold's key) and ends the hold. One Txn,
// retried through leader changes until ctx ends; with ctx already done it sends nothing.
//
// ended is true for exactly one call: the one that ended the hold, with a nil error or
// ErrLost if the hold was lost first. Another call, during or after it, gets ErrNotLocked.
// When the Txn cannot be done, the hold stays and the error says why; a failed Release is
// forgotten, so if its delete was in fact applied, the hold is then reported lost.
//
// Nil means this release's delete was seen to apply. When a try got no answer and the next
// found the key gone, the release cannot tell its own delete from another's (an operator's
// delete, the lease's expiry, before the release was called): it reports ErrLost. A release
// is reported as a loss then, never a loss as a release.
func (h *Hold) Release(ctx context.Context) (ended bool, err error) {
	h.mu.Lock()
	busy := h.state == releasing || h.state == over
	h.mu.Unlock()
	if busy {
		return false, ErrNotLocked
	}
	ended, final, err := release(ctx, h.cli, h.sess, []*Hold{h})
	if !ended {
		return false, fmt.Errorf("release %s: %w", h.key, err)
	}
	h.settleLoss()
	return true, final
}

// release ends members, the holds of one acquisition on sess (one, or a Group's), none of
// them releasing or over unless lost: the keys of those held go in one fenced delete (see
// deleteFenced); those lost end as they are. ended reports that every member has ended,
// with final the first loss among them (nil: every key was deleted by this release). When
// the delete cannot be done, members whose loss was seen meanwhile end with it, the others
// are held again, and err says why; then ended is false.
func release(ctx context.Context, cli *clientv3.Client, sess *Session, members []*Hold) (ended bool, final, err error) {
	var live, stray []*Hold
	for _, h := range members {
		h.mu.Lock()
		switch {
		case h.state == held:
			h.state, h.seen = releasing, nil
			live = append(live, h)
		case h.state == lost && keyMayRemain(h.err):
			// Lost, and the key may still be its own (it could not be watched, or its
			// maximum hold passed and the key's delete may not be done).
			stray = append(stray, h)
			final = firstErr(final, h.err)
		case h.state == lost:
			h.state = over
			fallthrough
		default: // over: lost, and seen by a release that could not finish
			final = firstErr(final, h.err)
		}
		h.mu.Unlock()
	}
	deleted, err := deleteFenced(ctx, cli, sess, append(live, stray...))
	// A key found gone was not deleted by this release: an operator's, whose reason the
	// holder must hear whether or not it watched its hold, or its lease's end.
	var gone []*Hold
	for i, h := range live {
		if deleted != nil && !deleted[i] && h.recordKey() != "" {
			gone = append(gone, h)
		}
	}
	why := map[*Hold]error{}
	if len(gone) > 0 {
		for i, err := range releasedErrs(context.WithoutCancel(ctx), cli, gone) {
			why[gone[i]] = err
		}
	}
	kept := false
	for _, h := range stray {
		h.mu.Lock()
		switch {
		case deleted != nil:
			h.state = over
			h.slot.free()
		case sess.ended():
			h.state = over // its key goes with the lease
		default:
			kept = true // lost still: a later release tries again
		}
		h.mu.Unlock()
	}
	for i, h := range live {
		var loss error
		h.mu.Lock()
		switch {
		case deleted != nil && !deleted[i]:
			loss = why[h]
			if loss == nil {
				loss = errKeyGone(h.key)
			}
		case deleted != nil:
		case h.seen != nil && errors.Is(h.seen, errUnwatched) && !sess.ended():
			// Its watch was refused while the delete got no answer: lost, and its key may
			// still be its own, so a later release tries again (as a stray, above).
			h.end(lost, h.seen)
			final = firstErr(final, h.seen)
			kept = true
			h.mu.Unlock()
			continue
		case h.seen != nil:
			loss = h.seen // the session ended, or the key went, while the delete got no answer
		case sess.ended():
			// No try got through before the session ended: the hold is lost, and its key
			// goes with the lease (revoked once etcd answers, or expired).
			loss = sess.lostErr()
		default:
			h.state = held
			kept = true
			h.mu.Unlock()
			continue
		}
		h.end(over, loss)
		h.mu.Unlock()
		final = firstErr(final, loss)
	}
	if kept {
		return false, final, err
	}
	for _, h := range members {
		h.waitMonitor()
	}
	return true, final, nil
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// deleteFenced deletes the key of each of holds that is still its hold's, in one Txn (a
// compare on its create revision; for several keys, a nested Txn each, so that the answer
// says which it deleted), and reports which it deleted: a key not deleted was found gone
// (perhaps by an earlier try of this call that got no answer). nil, with the error, when no
// try could tell. It stops trying once the session has ended: a release then blocks no
// longer than the session's local deadline, whatever ctx allows.
func deleteFenced(ctx context.Context, cli *clientv3.Client, sess *Session, holds []*Hold) ([]bool, error) {
	if len(holds) == 0 {
		return []bool{}, nil
	}
	build := func(t clientv3.Txn) clientv3.Txn {
		if len(holds) == 1 {
			return t.If(holds[0].IsOwner()).Then(clientv3.OpDelete(holds[0].key))
		}
		ops := make([]clientv3.Op, len(holds))
		for i, h := range holds {
			ops[i] = fencedDelete(h.key, h.rev)
		}
		return t.Then(ops...)
	}
	if err := sess.lostErr(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // sends nothing
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(sess.ctx, cancel)()
	res, err := commitWrite(ctx, cli, build)
	switch {
	case res.resp == nil && sess.lostErr() != nil:
		return nil, sess.lostErr()
	case res.resp == nil:
		return nil, err
	case err != nil:
		return nil, err // the holds were lost in the history that went: the session ends
	}
	deleted := make([]bool, len(holds))
	for i := range holds {
		if len(holds) == 1 {
			deleted[i] = res.resp.Succeeded
		} else {
			deleted[i] = res.resp.Responses[i].GetResponseTxn().GetSucceeded()
		}
	}
	return deleted, nil
}

// released ends the hold as released, for a caller whose own Txn deleted its key, fenced
// on its create revision, or found it gone.
func (h *Hold) released() {
	h.mu.Lock()
	h.end(over, nil)
	h.mu.Unlock()
	h.waitMonitor()
}

// Abandon ends the hold for an owner that gives it up and will not call Release again (a
// group of readers whose every member left while it queued, a leadership found lost as it
// was won): it tries Release for up to a second, and leaves the rest to the background,
// which releases it once etcd answers. It never blocks for longer.
func (h *Hold) Abandon(ctx context.Context) {
	dctx, cancel := detached(ctx, cleanupWait)
	ended, _ := h.Release(dctx)
	cancel()
	if !ended {
		janitorOf(h.cli).add(holdRelease{h})
	}
}

// holdRelease is the chore of releasing an abandoned hold.
type holdRelease struct{ h *Hold }

func (c holdRelease) attempt(ctx context.Context) bool {
	ended, err := c.h.Release(ctx)
	return ended || errors.Is(err, ErrNotLocked)
}

func (c holdRelease) drop() { c.h.observe(fmt.Errorf("%w: %w", ErrLost, errClientClosed)) }
