package rwmutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/etcdsync/etcdsync/internal/core"
)

// A group is the readers of one handle that share one read key.
type group struct {
	queued  chan struct{}      // closed once its key is in etcd, or the acquisition ended
	ready   chan struct{}      // closed once the acquisition has ended, either way
	cancel  context.CancelFunc // of the acquisition
	hold    *core.Hold         // the read hold, once granted
	err     error              // why the acquisition failed
	members int                // readers holding through the group
	scoped  []*scopedReader    // the RDos among the members that have not left
	waiting int                // readers waiting for its acquisition
	closed  bool               // it takes no more members
	sentry  *core.Sentry       // tells when a writer queued behind it; started by the first joiner

	releasing chan struct{} // while the last reader's release runs; closed after it

	checking bool   // a check of the key is under way
	next     *check // the check to start after it, shared by the readers who wait for it
}

// A readLoss is the handle's state once a read hold was found lost while readers held
// through the handle: RUnlock cannot tell which reader leaves, so each says ErrLost, and new
// readers wait, until every reader has left.
type readLoss struct {
	err     error         // the loss
	drained chan struct{} // closed once no reader is left
}

// readers counts the readers holding through the handle. Under rw.mu.
func (rw *RWMutex) readers() int {
	n := 0
	for _, g := range rw.groups {
		n += g.members
	}
	return n
}

// noteReadLoss records that a read hold was lost, if readers remain that may have held
// through it. Under rw.mu.
func (rw *RWMutex) noteReadLoss(err error) {
	if rw.readLoss == nil && rw.readers() > 0 {
		rw.readLoss = &readLoss{err: err, drained: make(chan struct{})}
	}
}

// endReadLoss ends the loss state once the last reader has left. Under rw.mu.
func (rw *RWMutex) endReadLoss() {
	if rw.readLoss != nil && rw.readers() == 0 {
		close(rw.readLoss.drained)
		rw.readLoss = nil
	}
}

// RLock waits until the read lock is held: until no write key is ahead of its read key. It
// joins a read hold of this handle at once, with no RPC, if no writer has queued behind it,
// and a waiting one by waiting with it. While readers of a lost read hold of this handle
// remain (see [RWMutex]), it first waits for them to leave.
//
// Errors: ctx's error, wrapped, when ctx ends: with ctx done already, having sent nothing;
// otherwise the last reader of a group to give up deletes the group's key before returning,
// within the bounds of [RWMutex.Lock]. [ErrInvalidOption]: rw was not made by [New], or its
// client is closed.
//
// Cost: one Txn for a reader that starts a group; none for one that joins.
func (rw *RWMutex) RLock(ctx context.Context) error {
	_, err := rw.rlock(ctx)
	return err
}

// rlock is RLock, returning the group it holds through.
func (rw *RWMutex) rlock(ctx context.Context) (_ *group, err error) {
	ctx, a, err := rw.rshell().Begin(ctx, core.Wait, "rlock", "etcdsync.rwmutex.RLock")
	if err != nil {
		return nil, err
	}
	defer func() { a.End(err) }()
	for {
		rw.mu.Lock()
		if loss := rw.readLoss; loss != nil {
			rw.mu.Unlock()
			select {
			case <-loss.drained:
				continue
			case <-ctx.Done():
				return nil, rw.errorf("rlock", ctx.Err())
			}
		}
		if wp := rw.wpending; wp != nil {
			// This handle's writer is queueing: let its key in first, then queue behind it.
			wp.blocked++
			rw.mu.Unlock()
			select {
			case <-wp.done:
			case <-ctx.Done():
			}
			rw.mu.Lock()
			if g := wp.next; g != nil {
				rw.mu.Unlock()
				return g, rw.await(ctx, g) // counted among its waiting readers
			}
			wp.blocked--
			rw.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return nil, rw.errorf("rlock", err)
			}
			continue
		}
		g := rw.joinable()
		switch {
		case rw.readLoss != nil:
			rw.mu.Unlock()
			continue // joinable found a lost group
		case g != nil && g.hold != nil:
			g.members++
			rw.mu.Unlock()
			return g, nil
		case g == nil:
			if err := ctx.Err(); err != nil {
				rw.mu.Unlock()
				return nil, rw.errorf("rlock", err)
			}
			g = rw.startGroup()
		}
		g.waiting++
		rw.mu.Unlock()
		return g, rw.await(ctx, g)
	}
}

// joinable returns the newest group if it takes members: it is queued, or it holds, is
// live and no writer has queued behind it. A held group found lost is closed, and the loss
// noted. Under rw.mu.
func (rw *RWMutex) joinable() *group {
	if len(rw.groups) == 0 {
		return nil
	}
	g := rw.groups[len(rw.groups)-1]
	if g.closed {
		return nil
	}
	if g.hold != nil {
		if g.sentry == nil {
			g.sentry = rw.w.Q.WatchBehind(g.hold, writeKind)
		}
		switch {
		case !g.hold.Live() || g.sentry.Lost():
			g.closed = true
			rw.noteReadLoss(fmt.Errorf("%w: a read hold of this handle was lost", ErrLost))
			return nil
		case g.sentry.Behind():
			g.closed = true
			return nil
		}
	}
	return g
}

// startGroup queues a new group's read key, in a goroutine that ends with the acquisition.
// Under rw.mu.
func (rw *RWMutex) startGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	g := &group{queued: make(chan struct{}), ready: make(chan struct{}), cancel: cancel}
	rw.groups = append(rw.groups, g)
	go rw.acquire(ctx, g)
	return g
}

// acquire runs the group's acquisition. Readers still waiting then become its members; if
// none is left, it gives the hold up at once.
func (rw *RWMutex) acquire(ctx context.Context, g *group) {
	defer close(g.ready)
	defer g.cancel()
	var queued sync.Once
	markQueued := func() { queued.Do(func() { close(g.queued) }) }
	defer markQueued()
	spec := readSpec()
	spec.Tel = rw.r.Tel
	h, err := rw.w.Q.AcquireNotify(ctx, spec, nil, markQueued)
	if err == nil {
		rw.r.Tel.Held(h)
	}
	rw.mu.Lock()
	if err == nil && g.waiting > 0 {
		g.hold, g.members, g.waiting = h, g.waiting, 0
		rw.mu.Unlock()
		return
	}
	g.err, g.closed = err, true
	rw.dropGroup(g)
	rw.mu.Unlock()
	if err == nil { // every reader gave up meanwhile
		h.Abandon(ctx)
	}
}

// await waits for g's acquisition as one of its waiting readers.
func (rw *RWMutex) await(ctx context.Context, g *group) error {
	select {
	case <-g.ready:
	case <-ctx.Done():
	}
	rw.mu.Lock()
	switch {
	case g.hold != nil:
		rw.mu.Unlock()
		return nil // a member, also if ctx ended at the same moment
	case g.err != nil:
		rw.mu.Unlock()
		return rw.errorf("rlock", g.err)
	}
	g.waiting--
	last := g.waiting == 0
	if last {
		g.closed = true // a reader coming now starts a group of its own
		g.cancel()
	}
	rw.mu.Unlock()
	if last {
		<-g.ready // the acquisition has deleted its key
	}
	return rw.errorf("rlock", ctx.Err())
}

// dropGroup removes g from the handle's groups. Under rw.mu.
func (rw *RWMutex) dropGroup(g *group) {
	rw.groups = slices.DeleteFunc(rw.groups, func(x *group) bool { return x == g })
}

// TryRLock takes the read lock only if no writer holds it or waits for it. It joins a read
// hold of this handle where [RWMutex.RLock] would.
//
// Errors: [ErrLocked] otherwise, having written nothing, and while readers of a lost read hold
// of this handle remain (see [RWMutex]). ctx's error with ctx done already, unless it joins.
// [ErrInvalidOption] as for RLock.
//
// Cost: one Txn; none when it joins.
func (rw *RWMutex) TryRLock(ctx context.Context) (err error) {
	ctx, a, err := rw.rshell().Begin(ctx, core.Try, "try rlock", "etcdsync.rwmutex.TryRLock")
	if err != nil {
		return err
	}
	defer func() { a.End(err) }()
	rw.mu.Lock()
	if rw.wpending != nil || rw.write != nil {
		rw.mu.Unlock()
		return rw.errorf("try rlock", ErrLocked)
	}
	g := rw.joinable()
	if rw.readLoss != nil {
		rw.mu.Unlock()
		return rw.errorf("try rlock", fmt.Errorf("%w: readers of a lost read hold have not all left", ErrLocked))
	}
	if g != nil {
		defer rw.mu.Unlock()
		if g.hold == nil {
			return rw.errorf("try rlock", ErrLocked) // queued: a writer is ahead
		}
		g.members++
		return nil
	}
	rw.mu.Unlock()
	h, err := rw.w.Q.TryAcquire(ctx, readSpec())
	a.Held(h)
	if err != nil {
		return rw.errorf("try rlock", err)
	}
	rw.mu.Lock()
	rw.groups = append(rw.groups, &group{queued: core.Closed, ready: core.Closed, cancel: func() {}, hold: h, members: 1})
	rw.mu.Unlock()
	return nil
}

// RUnlock ends one reader's hold. The last reader of a group deletes the group's key, fenced
// as Unlock's delete. Each other reader leaving first proves the key was there all along (so
// that a reader cut off from etcd, whose lease may have expired and a writer come in, cannot
// take its read for a sound one) by a read of the key that starts after its call. If etcd
// cannot be reached before ctx ends, or ctx is done already, the read lock stays held and
// RUnlock may be called again. An RUnlock that finds no reader left but the last one's
// release under way waits for its outcome, then returns [ErrNotLocked] if that released the
// read lock, and otherwise leaves as that reader.
//
// Errors: [ErrNotLocked] without a read hold. [ErrLost] if the hold was lost (the reader's hold
// ends all the same), also for every reader still in the handle once one of its read holds
// was found lost (see [RWMutex]), and at once for every reader once the client is closed (the
// hold can then be neither proven nor released; the key goes with its lease). On an RWMutex
// not made by [New], an error matching [ErrInvalidOption] and ErrNotLocked.
//
// Cost: one Txn for the last reader; one read, shared by the readers leaving at once, for
// the others.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	if s := rw.wshell(); s == unmade {
		return s.Unheld("runlock")
	}
	return rw.runlock(ctx, nil)
}

// runlock is RUnlock of any reader (r nil), or of RDo's reader r, which leaves its own group
// unless it has left already (ErrNotLocked).
func (rw *RWMutex) runlock(ctx context.Context, r *scopedReader) (err error) {
	ctx, a := rw.rshell().Start(ctx, core.Release, "etcdsync.rwmutex.RUnlock")
	defer func() { a.End(err) }()
	rw.mu.Lock()
	i := slices.IndexFunc(rw.groups, func(g *group) bool { return g.members > 0 })
	if r != nil {
		if i, err = rw.awaitScoped(ctx, r); err != nil {
			return err // under no lock
		}
	} else if i < 0 {
		j := slices.IndexFunc(rw.groups, func(g *group) bool { return g.releasing != nil })
		if j < 0 {
			rw.mu.Unlock()
			return rw.errorf("runlock", ErrNotLocked)
		}
		// The last reader of that group is releasing it: if that fails, it is a reader
		// again, and this RUnlock leaves as it. Groups older than it take no member.
		g := rw.groups[j]
		releasing := g.releasing
		rw.mu.Unlock()
		select {
		case <-releasing:
		case <-ctx.Done():
			return rw.errorf("runlock", ctx.Err())
		}
		rw.mu.Lock()
		if i = slices.Index(rw.groups, g); i < 0 || g.members == 0 {
			rw.mu.Unlock()
			return rw.errorf("runlock", ErrNotLocked)
		}
	}
	// The oldest: while a reader holds through a younger group, no writer can be served
	// between the two, so the proof that the oldest key lasted covers every reader, and
	// releasing it first is best for writers.
	g := rw.groups[i]
	if loss := g.hold.EndIfClientClosed(); loss != nil {
		rw.noteReadLoss(loss) // no read of the key can prove anything now
	}
	g.members--
	taken := g.takeScoped(r)
	if g.members > 0 {
		if loss := rw.readLoss; loss != nil {
			rw.endReadLoss()
			rw.mu.Unlock()
			return rw.errorf("runlock", loss.err)
		}
		c := rw.checkLater(g)
		rw.mu.Unlock()
		return rw.leave(ctx, g, c, taken)
	}
	g.closed = true
	g.releasing = make(chan struct{})
	sentry := g.sentry
	g.sentry = nil
	rw.mu.Unlock()
	if sentry != nil {
		sentry.Stop()
	}
	ended, err := g.hold.Release(ctx)
	rw.mu.Lock()
	if ended {
		rw.dropGroup(g)
		if errors.Is(err, ErrLost) {
			rw.noteReadLoss(err)
		} else if loss := rw.readLoss; loss != nil {
			err = loss.err // this reader may be one of the lost hold's
		}
		rw.endReadLoss()
	} else {
		g.rejoin(taken) // still held: the next RUnlock tries again
	}
	close(g.releasing)
	g.releasing = nil
	rw.mu.Unlock()
	if err != nil {
		return rw.errorf("runlock", err)
	}
	return nil
}
