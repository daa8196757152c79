package core

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Group is one hold of several names, granted by AcquireAll or TryAcquireAll: a member
// Hold per name, all created by one Txn at one create revision, the Group's token. The loss
// of any member is the loss of the Group: Done closes and Err turns ErrLost at once, and
// the other members' keys stay until Release removes them, with the rest, in one fenced
// Txn. Each member is watched as every Hold is (keywatch.go), from the first call to Done,
// Err or OnEnd on.
//
// A nil *Group stands for no hold, as a nil *Hold does.
type Group struct {
	cli     *clientv3.Client
	sess    *Session
	rev     int64
	members []*Hold

	mu        sync.Mutex
	watched   bool         // every member's end is reported to the Group (OnEnd)
	releasing bool         // a Release is under way
	over      bool         // released: every member has ended
	ending                 // err: the first loss of a member; nil while every member holds
	metrics   *holdMetrics // nil unless counted: see Telemetry.HeldGroup
	asking    *asking      // what asks any member to let go, once Asked was called
	yield     bool         // its queues heed asks (WithYieldOnAsk)
}

func newGroup(cli *clientv3.Client, sess *Session, slots []*slot, rev int64) *Group {
	g := &Group{cli: cli, sess: sess, rev: rev, members: make([]*Hold, len(slots)), ending: ending{done: make(chan struct{})}}
	for i, sl := range slots {
		g.members[i] = newHold(cli, sess, sl, rev)
		g.members[i].group = g
	}
	return g
}

// Token is the create revision that every key of the Group shares; 0 for no hold.
func (g *Group) Token() int64 {
	if g == nil {
		return 0
	}
	return g.rev
}

// Keys are the Group's keys, in the order of the queues it was acquired on; nil for no hold.
func (g *Group) Keys() []string {
	if g == nil {
		return nil
	}
	keys := make([]string, len(g.members))
	for i, h := range g.members {
		keys[i] = h.key
	}
	return keys
}

// IsOwner is a compare per key that holds only while that key is the one the Group
// created: a Txn guarded by all of them writes only while the whole Group holds.
func (g *Group) IsOwner() []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, len(g.members))
	for i, h := range g.members {
		cmps[i] = h.IsOwner()
	}
	return cmps
}

// Done is closed when the Group ends: released, or any member lost. The first call starts
// the watch of every member.
func (g *Group) Done() <-chan struct{} {
	if g == nil {
		return Closed
	}
	g.watch()
	return g.done
}

// Err is nil while every member holds or after a clean release, ErrLost once any member
// was lost. The first call starts the watch of every member.
func (g *Group) Err() error {
	if g == nil {
		return ErrNotLocked
	}
	g.watch()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// OnEnd arranges for f to be called once when the Group ends, with its final error; at
// once if it has ended. It starts the watch, as Done does. f runs under the Group's lock:
// it must be quick and must not call the Group.
func (g *Group) OnEnd(f func(error)) {
	g.watch()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addOnEnd(f)
}

// Asked returns a channel that is closed once any member is asked to let go (Hold.Asked);
// nil for no hold.
func (g *Group) Asked() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.asks().ch
}

func (g *Group) asks() *asking {
	g.mu.Lock()
	if g.asking == nil {
		g.asking = newAsking()
	}
	a := g.asking
	g.mu.Unlock()
	for _, h := range g.members {
		h.asks(a)
	}
	return a
}

// heeds is the Group's asking if its queues heed asks (WithYieldOnAsk); else nil.
func (g *Group) heeds() *asking {
	if g == nil || !g.yield {
		return nil
	}
	return g.asks()
}

// watch has every member report its end to the Group, and reports a session known to have
// ended. The members' callbacks take g.mu under the member's lock, so g.mu is never held
// while a member is called.
func (g *Group) watch() {
	g.mu.Lock()
	watched := g.watched
	g.watched = true
	g.mu.Unlock()
	if !watched {
		for _, h := range g.members {
			h.OnEnd(g.memberEnded)
		}
	}
	for _, h := range g.members {
		h.checkSession()
	}
}

// memberEnded is a member's OnEnd: a loss ends the Group; a clean end is a Release's own,
// which ends the Group once every member is done. Under the member's lock.
func (g *Group) memberEnded(err error) {
	if err == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lose(err)
}

// lose records the first loss and ends the Group. Under g.mu.
func (g *Group) lose(err error) {
	if g.err == nil {
		g.err = err
	}
	g.end()
}

// end closes done with the Group's final error (g.err), records it and runs the OnEnd
// callbacks, once. Under g.mu.
func (g *Group) end() {
	if g.ended() {
		return
	}
	g.recordEnd(g.err)
	g.finish(g.err)
}

// Release deletes the keys still held, in one Txn, each only if it is still the Group's (a
// compare on its create revision, in a nested Txn per key, so that the answer says which
// it deleted), and ends the Group. Retried through leader changes until ctx ends; with ctx
// already done it sends nothing. As Hold.Release: ended is true for the one call that ended
// the Group, with nil, or ErrLost if any member was lost first or found gone; another call
// gets ErrNotLocked; when the Txn cannot be done, the Group stays and the error says why.
func (g *Group) Release(ctx context.Context) (ended bool, err error) {
	g.mu.Lock()
	if g.releasing || g.over {
		g.mu.Unlock()
		return false, ErrNotLocked
	}
	g.releasing = true
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.releasing = false
		g.mu.Unlock()
	}()

	ended, loss, err := release(ctx, g.cli, g.sess, g.members)
	if !ended {
		if loss != nil {
			g.mu.Lock()
			g.lose(loss)
			g.mu.Unlock()
		}
		return false, fmt.Errorf("release %s: %w", describeHolds(g.members), err)
	}
	g.mu.Lock()
	if loss != nil && g.err == nil {
		g.err = loss
	}
	g.over = true
	g.end()
	final := g.err
	g.mu.Unlock()
	g.settleLoss()
	return true, final
}

func describeHolds(hs []*Hold) string {
	if len(hs) == 1 {
		return hs[0].key
	}
	return fmt.Sprintf("%s and %d more", hs[0].key, len(hs)-1)
}

// client is the client the Group was acquired through (see Scoper).
func (g *Group) client() *clientv3.Client { return g.cli }

// HeldGroup is Held for a Group.
func (a *Attempt) HeldGroup(g *Group) {
	if a.t == nil || g == nil {
		return
	}
	a.t.HeldGroup(g)
	a.token = g.Token()
}

// recordEnd is Hold.recordEnd for the Group. Under g.mu, once. A loss whose cause only etcd
// can tell is counted by settleLoss, which the member that saw its key go calls.
func (g *Group) recordEnd(err error) { g.metrics.end(err, g.sess) }

// settleLoss is Hold.settleLoss for the Group: a Release returns once the loss is counted.
func (g *Group) settleLoss() {
	settle(&g.mu, &g.metrics, g.sess, func() bool { return leaseGone(g.cli, g.sess) })
}

// EndIfClientClosed is Hold.EndIfClientClosed for every member: the Group is then lost, and
// Release returns the loss at once.
func (g *Group) EndIfClientClosed() error {
	var loss error
	if g != nil {
		for _, h := range g.members {
			loss = firstErr(loss, h.EndIfClientClosed())
		}
	}
	return loss
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
				loss = KeyGone(h.key)
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
	clearAsk(ctx, cli, members)
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
	res, err := CommitWrite(ctx, cli, build)
	switch {
	case res.Resp == nil && sess.lostErr() != nil:
		return nil, sess.lostErr()
	case res.Resp == nil:
		return nil, err
	case err != nil:
		return nil, err // the holds were lost in the history that went: the session ends
	}
	deleted := make([]bool, len(holds))
	for i := range holds {
		if len(holds) == 1 {
			deleted[i] = res.Resp.Succeeded
		} else {
			deleted[i] = res.Resp.Responses[i].GetResponseTxn().GetSucceeded()
		}
	}
	return deleted, nil
}

// Released ends the hold as released, for a caller whose own Txn deleted its key, fenced
// on its create revision, or found it gone.
func (h *Hold) Released() {
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

// AskRecordKey is where an ask that the holder of key let go lies: laid out as
// ReleaseRecordKey, with "\x00asked/".
func AskRecordKey(namePrefix, key string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00asked/" + strings.TrimPrefix(key, namePrefix)
}

// AskedError is the ask that a hold let go (its Asked closed): the key asked, and the
// record of the ask (why, who, when). It matches ErrAsked.
type AskedError struct {
	Key    string
	Record ReleaseRecord
	rec    *mvccpb.KeyValue // where the record lies, and its create revision
}

func (e *AskedError) Error() string {
	return fmt.Sprintf("%v: key %s: %s (by %s at %s)", ErrAsked, e.Key, quoteReason(e.Record.Reason),
		e.Record.By, e.Record.At.Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrAsked) hold.
func (e *AskedError) Unwrap() error { return ErrAsked }

// followAsks follows h's AskRecordKey until a record names h's token (a is asked), ctx
// ends (the hold ended, or the client closed), or the record cannot be read (a grant of the
// name's keys alone does not cover it): then h is never asked.
func (h *Hold) followAsks(ctx context.Context, a *asking) {
	key := AskRecordKey(h.key[:h.slot.name], h.key)
	judge := func(kvs []*mvccpb.KeyValue) Verdict {
		rec, ok := recordOf(kvs, h.rev)
		if !ok {
			return StillWaiting
		}
		a.ask(&AskedError{Key: h.key, Record: rec, rec: &mvccpb.KeyValue{Key: kvs[0].Key, CreateRevision: kvs[0].CreateRevision}})
		return WaitOver
	}
	_, _ = Follow(ctx, h.cli, key, nil,
		func() (int64, Verdict, error) {
			resp, err := ReadState(ctx, h.cli, clientv3.OpGet(key))
			if err != nil {
				return 0, StillWaiting, err
			}
			return resp.Header.Revision, judge(resp.Responses[0].GetResponseRange().Kvs), nil
		},
		func(ev *clientv3.Event) (Verdict, error) {
			if ev.Type != clientv3.EventTypePut {
				return StillWaiting, nil
			}
			return judge([]*mvccpb.KeyValue{ev.Kv}), nil
		})
}

// clearAsk deletes the record of the ask that members, released now, were told of (they
// share one asking): its purpose is served. Best effort, one Txn fenced on the record's
// create revision, only for a hold that was told of an ask.
func clearAsk(ctx context.Context, cli *clientv3.Client, members []*Hold) {
	h := members[0]
	h.mu.Lock()
	a := h.asking
	h.mu.Unlock()
	if a == nil {
		return
	}
	select {
	case <-a.ch:
	default:
		return // not asked
	}
	if e, ok := a.err.(*AskedError); ok && e.rec != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWait)
		defer cancel()
		_, _ = cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(clientv3.Compare(clientv3.CreateRevision(string(e.rec.Key)), "=", e.rec.CreateRevision)).
			Then(clientv3.OpDelete(string(e.rec.Key))).
			Commit()
	}
}
