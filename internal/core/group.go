package core

import (
	"context"
	"fmt"
	"sync"
	"time"

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
	done    chan struct{}

	mu        sync.Mutex
	watched   bool  // every member's end is reported to the Group (OnEnd)
	releasing bool  // a Release is under way
	ended     bool  // done is closed
	over      bool  // released: every member has ended
	err       error // the first loss of a member; nil while every member holds
	onEnd     []func(error)
	metrics   *holdMetrics // nil unless counted: see Telemetry.HeldGroup
}

func newGroup(cli *clientv3.Client, sess *Session, slots []*slot, rev int64) *Group {
	g := &Group{cli: cli, sess: sess, rev: rev, members: make([]*Hold, len(slots)), done: make(chan struct{})}
	for i, sl := range slots {
		g.members[i] = newHold(cli, sess, sl, rev)
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
	if g.ended {
		f(g.err)
		return
	}
	g.onEnd = append(g.onEnd, f)
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
	if g.ended {
		return
	}
	g.ended = true
	close(g.done)
	g.recordEnd(g.err)
	for _, f := range g.onEnd {
		f(g.err)
	}
	g.onEnd = nil
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

	var live []*Hold
	var loss error
	for _, h := range g.members {
		h.mu.Lock()
		switch h.state {
		case held:
			h.state, h.seen = releasing, nil
			live = append(live, h)
		case lost:
			h.state = over
			fallthrough
		default: // over: lost, and seen by a Release that could not finish
			if loss == nil {
				loss = h.err
			}
		}
		h.mu.Unlock()
	}

	deleted, err := deleteAllFenced(ctx, g.cli, g.sess, live)
	switch {
	case deleted != nil:
		for i, h := range live {
			var final error
			if !deleted[i] {
				final = errKeyGone(h.key)
			}
			loss = firstErr(loss, final)
			h.mu.Lock()
			h.end(over, final)
			h.mu.Unlock()
		}
	case g.sess.ended():
		// See Hold.Release: the keys go with the lease.
		final := g.sess.lostErr()
		loss = firstErr(loss, final)
		for _, h := range live {
			h.mu.Lock()
			h.end(over, final)
			h.mu.Unlock()
		}
	default:
		for _, h := range live {
			h.mu.Lock()
			if h.seen != nil {
				loss = firstErr(loss, h.seen) // its key went while the delete got no answer
				h.end(over, h.seen)
			} else {
				h.state = held
			}
			h.mu.Unlock()
		}
		if loss != nil {
			g.mu.Lock()
			g.lose(loss)
			g.mu.Unlock()
		}
		return false, fmt.Errorf("release %s: %w", describeHolds(g.members), err)
	}
	for _, h := range g.members {
		h.waitMonitor()
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

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func describeHolds(hs []*Hold) string {
	if len(hs) == 1 {
		return hs[0].key
	}
	return fmt.Sprintf("%s and %d more", hs[0].key, len(hs)-1)
}

// deleteAllFenced deletes each key of holds that is still its hold's, in one Txn, and says
// which it deleted; nil, with the error, if no try could tell. Its retries are
// Hold.deleteFenced's.
func deleteAllFenced(ctx context.Context, cli *clientv3.Client, sess *Session, holds []*Hold) ([]bool, error) {
	if len(holds) == 0 {
		return []bool{}, nil
	}
	ops := make([]clientv3.Op, len(holds))
	for i, h := range holds {
		ops[i] = fencedDelete(h.key, h.rev)
	}
	var b backoff
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(sess.ctx, cancel)()
	for {
		if err := sess.lostErr(); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		tctx, cancelTry := tryContext(ctx)
		sent := clockOf(cli).now()
		resp, err := cli.Txn(clientv3.WithRequireLeader(tctx)).Then(ops...).Commit()
		tryEnded := tctx.Err() != nil
		cancelTry()
		if err == nil {
			if rw := clockOf(cli).linear(resp.Header, sent); rw != nil {
				rewind(cli, rw)
				return nil, fmt.Errorf("%w: %w", ErrLost, rw)
			}
			deleted := make([]bool, len(holds))
			for i := range holds {
				deleted[i] = resp.Responses[i].GetResponseTxn().GetSucceeded()
			}
			return deleted, nil
		}
		if ctx.Err() != nil || !transient(err) && !tryEnded {
			return nil, err
		}
		if err := b.wait(ctx); err != nil {
			return nil, err
		}
	}
}

// client is the client the Group was acquired through (see Scoper).
func (g *Group) client() *clientv3.Client { return g.cli }

// HeldGroup is Held for a Group: it counts as one hold of t's primitive, lost when any of
// its members is.
func (t *Telemetry) HeldGroup(g *Group) {
	if t == nil || g == nil {
		return
	}
	bg := context.Background()
	counted := t.ins.holds.Enabled(bg)
	if !counted && !t.ins.hold.Enabled(bg) && !t.ins.lost.Enabled(bg) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.metrics != nil {
		return
	}
	if counted {
		t.ins.holds.Add(bg, 1, t.plain...)
	}
	g.metrics = &holdMetrics{t: t, granted: time.Now(), counted: counted}
	if g.ended {
		g.recordEnd(g.err)
	}
}

// HeldGroup is Held for a Group.
func (a *Attempt) HeldGroup(g *Group) {
	if a.t == nil || g == nil {
		return
	}
	a.t.HeldGroup(g)
	a.token = g.Token()
}

// recordEnd is Hold.recordEnd for the Group. Under g.mu, once. A loss whose cause only etcd
// can tell (a key deleted while the session lived) is counted by settleLoss, which it
// starts off the caller's goroutine: the caller may be a member's watch.
func (g *Group) recordEnd(err error) {
	if m := g.metrics; m.end(err, g.sess) {
		m.settled = make(chan struct{})
		go g.countLoss(m)
	}
}

// countLoss counts the loss of a Group whose key went while its session lived: revoked if
// the lease is gone too, else deleted (see Hold.settleLoss). One TimeToLive, bounded by a
// second.
func (g *Group) countLoss(m *holdMetrics) {
	defer close(m.settled)
	c := causeDeleted
	if g.members[0].leaseGone() {
		c = causeRevoked
	}
	if sc, known := lossCause(errKeyDeleted, g.sess); known {
		c = sc
	}
	m.t.ins.lost.Add(context.Background(), 1, m.t.byCause[c]...)
}

// settleLoss waits until the Group's loss, if any, is counted: a Release returns with it.
func (g *Group) settleLoss() {
	g.mu.Lock()
	m := g.metrics
	g.mu.Unlock()
	if m != nil && m.settled != nil {
		<-m.settled
	}
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
