package rwmutex

import (
	"context"
	"slices"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Do takes the write lock as [RWMutex.Lock] does, runs fn while it is held, and releases it
// once fn has returned: also when fn panics (the panic goes on after the release) and when
// ctx has ended meanwhile (the release has a context of its own: see [etcdsync]). fn's ctx
// derives from ctx and also ends as soon as the hold ends before fn returns: lost, with the
// loss as its cause (context.Cause matches [ErrLost]), or released by an Unlock
// ([ErrNotLocked]).
//
// Do releases only the write hold it took: if fn unlocked it, Do's release does nothing and
// says [ErrNotLocked], also when another Lock of the handle holds by then. If fn downgraded
// it ([RWMutex.Downgrade]), Do leaves the read hold it became as an RUnlock would.
//
// Errors: Lock's error, without calling fn. An error matching [ErrLost] if the hold was lost
// before it was released (joined with fn's error, if any): never nil when the hold was lost
// while fn ran. Otherwise fn's error joined with the release's. A nil fn is
// [ErrInvalidOption], and nothing is acquired.
func (rw *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return rw.errorf("do", core.ErrNilFunc)
	}
	h, err := rw.lock(ctx)
	if err != nil {
		return err
	}
	return core.Scoped(ctx, h, fn, func(ctx context.Context) error {
		if rw.readThrough(h) {
			return rw.runlock(ctx, nil) // fn downgraded it: leave as its reader
		}
		return rw.unlock(ctx, h)
	})
}

// readThrough reports whether h, a write hold, is now a read hold of the handle (Downgrade)
// that readers hold through.
func (rw *RWMutex) readThrough(h *core.Hold) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return slices.ContainsFunc(rw.groups, func(g *group) bool { return g.hold == h && g.members > 0 })
}

// RDo is [RWMutex.Do] for the read lock: it takes it as [RWMutex.RLock] does, runs fn while it
// is held and releases it as [RWMutex.RUnlock] does. fn's ctx ends when the read hold ends,
// which for the readers of one handle is one hold (see [RWMutex]).
//
// RDo leaves only the read hold it joined. An RUnlock does not say which reader leaves; once
// the readers' RUnlocks leave that hold with fewer readers than the RDos in it, one of those
// RDos counts as having left, and its release does nothing and says [ErrNotLocked].
func (rw *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return rw.errorf("rdo", core.ErrNilFunc)
	}
	g, err := rw.rlock(ctx)
	if err != nil {
		return err
	}
	r, h := rw.enlist(g)
	return core.Scoped(ctx, h, fn, func(ctx context.Context) error { return rw.runlock(ctx, r) })
}

// A scopedReader is an RDo's reader in a group. Which reader an RUnlock is cannot be told, so
// an RUnlock that leaves a group with fewer members than RDos marks one of them left: its
// release then frees no other reader's hold.
type scopedReader struct {
	g    *group
	left bool // under rw.mu
}

// enlist makes the reader that rlock just made a member of g an RDo's, and returns the hold
// it holds through.
func (rw *RWMutex) enlist(g *group) (*scopedReader, *core.Hold) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	r := &scopedReader{g: g}
	if g.members > len(g.scoped) {
		g.scoped = append(g.scoped, r)
	} else {
		r.left = true // an RUnlock too many left in its place already
	}
	return r, g.hold
}

// awaitScoped finds r's group, under rw.mu: its index, with rw.mu still held. Once r has
// left it returns, with rw.mu unlocked, ErrNotLocked, after the outcome of the last reader's
// release under way (which gives r back if it fails); or ctx's error.
func (rw *RWMutex) awaitScoped(ctx context.Context, r *scopedReader) (int, error) {
	for r.left {
		releasing := r.g.releasing
		rw.mu.Unlock()
		if releasing == nil {
			return -1, rw.errorf("runlock", ErrNotLocked)
		}
		select {
		case <-releasing:
		case <-ctx.Done():
			return -1, rw.errorf("runlock", ctx.Err())
		}
		rw.mu.Lock()
	}
	i := slices.Index(rw.groups, r.g)
	if i < 0 {
		rw.mu.Unlock()
		return -1, rw.errorf("runlock", ErrNotLocked)
	}
	return i, nil
}

// takeScoped marks as left the RDo reader that leaves g, g.members already counted down: r
// itself, or for another RUnlock (r nil) one of g's RDos once g has fewer members than RDos.
// It returns that reader, for rejoin. Under rw.mu.
func (g *group) takeScoped(r *scopedReader) *scopedReader {
	if r == nil {
		if g.members >= len(g.scoped) {
			return nil
		}
		r = g.scoped[len(g.scoped)-1]
	}
	g.scoped = slices.DeleteFunc(g.scoped, func(x *scopedReader) bool { return x == r })
	r.left = true
	return r
}

// rejoin undoes a leave that did not get through: the reader holds again. Under rw.mu.
func (g *group) rejoin(taken *scopedReader) {
	g.members++
	if taken != nil {
		taken.left = false
		g.scoped = append(g.scoped, taken)
	}
}
