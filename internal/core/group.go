package core

import (
	"context"
	"fmt"
	"sync"

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
