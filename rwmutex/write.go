package rwmutex

import (
	"context"

	"github.com/etcdsync/etcdsync/internal/core"
)

// A pendingWrite is a Lock of this handle on its way into the queue. Readers that arrive
// meanwhile wait for it, then queue together right behind it, before the handle's next
// Lock: neither side starves the other.
type pendingWrite struct {
	done    chan struct{} // closed when the Lock has its hold or has failed
	blocked int           // readers waiting for done
	next    *group        // their group, started when done closed (nil if blocked was 0)
}

// Lock waits until the write lock is held: until no key, read or write, is ahead of its key.
// Readers of this handle that arrive meanwhile queue behind it. Like [sync.RWMutex], the write
// side stays taken until [RWMutex.Unlock], also once its hold is lost: Unlock (which then
// returns [ErrLost]) before Lock again.
//
// Errors: ctx's error, wrapped, when ctx ends, having left no key (see [etcdsync] for how
// long that may take). [ErrLost]: the session's lease expired while waiting; the next Lock
// takes a new one. [ErrInvalidOption]: rw was not made by [New], or its client is closed.
//
// Cost: one Txn uncontended, and one lease grant on the client's first use.
func (rw *RWMutex) Lock(ctx context.Context) error {
	_, err := rw.lock(ctx)
	return err
}

// lock is Lock, returning the write hold it took.
func (rw *RWMutex) lock(ctx context.Context) (_ *core.Hold, err error) {
	ctx, a, err := rw.wshell().Begin(ctx, core.Wait, "lock", "etcdsync.rwmutex.Lock")
	if err != nil {
		return nil, err
	}
	defer func() { a.End(err) }()
	if err := rw.turn.Take(ctx); err != nil {
		return nil, rw.errorf("lock", err)
	}
	wp := &pendingWrite{done: make(chan struct{})}
	rw.mu.Lock()
	rw.wpending = wp
	var ahead []*group
	for _, g := range rw.groups {
		g.closed = true
		ahead = append(ahead, g)
	}
	rw.mu.Unlock()
	// Readers of this handle that came before this Lock queue before it.
	for _, g := range ahead {
		select {
		case <-g.queued:
		case <-ctx.Done():
		}
	}
	var h *core.Hold
	err = ctx.Err()
	if err == nil {
		spec := writeSpec()
		spec.Tel = rw.w.Tel
		h, err = rw.w.Q.Acquire(ctx, spec, nil)
		a.Held(h)
	}
	rw.mu.Lock()
	rw.wpending, rw.write = nil, h
	if wp.blocked > 0 {
		wp.next = rw.startGroup()
		wp.next.waiting = wp.blocked
	}
	rw.mu.Unlock()
	close(wp.done)
	if err != nil {
		rw.turn.Give()
		return nil, rw.errorf("lock", err)
	}
	return h, nil
}

// TryLock takes the write lock only if nobody holds the lock or waits for it, reader or
// writer, and this handle neither holds nor waits.
//
// Errors: [ErrLocked] otherwise, having written nothing. ctx's error and [ErrInvalidOption]
// as for [RWMutex.Lock].
//
// Cost: one Txn; none when this handle's own readers are in the way.
func (rw *RWMutex) TryLock(ctx context.Context) (err error) {
	ctx, a, err := rw.wshell().Begin(ctx, core.Try, "try lock", "etcdsync.rwmutex.TryLock")
	if err != nil {
		return err
	}
	defer func() { a.End(err) }()
	if !rw.turn.TryTake() {
		return rw.errorf("try lock", ErrLocked)
	}
	rw.mu.Lock()
	readers := len(rw.groups) > 0
	rw.mu.Unlock()
	if readers {
		rw.turn.Give()
		return rw.errorf("try lock", ErrLocked)
	}
	h, err := rw.w.Q.TryAcquire(ctx, writeSpec())
	a.Held(h)
	if err != nil {
		rw.turn.Give()
		return rw.errorf("try lock", err)
	}
	rw.mu.Lock()
	rw.write = h
	rw.mu.Unlock()
	return nil
}

// Unlock releases the write lock, with a delete fenced on the key's create revision: a late
// or repeated Unlock never frees a newer holder. If etcd cannot be reached before ctx ends,
// or ctx is done already (then nothing is sent), the lock stays held and Unlock may be called
// again. An Unlock during another one waits for its outcome, then returns [ErrNotLocked] if
// that released the lock, and otherwise tries itself.
//
// Without a hold of Lock, Unlock releases an upgraded read ([RWMutex.Upgrade]).
//
// Errors: [ErrNotLocked] without a write hold. [ErrLost] if the hold was lost before, or the
// client is closed; the hold has ended all the same. On an RWMutex not made by [New], an
// error matching [ErrInvalidOption] and ErrNotLocked.
//
// Cost: one Txn.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	if s := rw.wshell(); s == unmade {
		return s.Unheld("unlock")
	}
	rw.mu.Lock()
	w, up := rw.write, rw.up
	upgraded := w == nil && rw.upgraded
	rw.mu.Unlock()
	if upgraded {
		return rw.uunlock(ctx, "unlock", up)
	}
	return rw.unlock(ctx, w)
}

// unlock releases h if it is still the handle's write hold; ErrNotLocked if it is not (nil,
// or released already), so that Do never frees a later write hold of the handle.
func (rw *RWMutex) unlock(ctx context.Context, h *core.Hold) error {
	return rw.release(ctx, "unlock", "etcdsync.rwmutex.Unlock", h, &rw.write, &rw.turn)
}

// release releases h if it is still the handle's exclusive hold in *held (the write hold,
// or the upgradable read), and then gives the turn of that side back; ErrNotLocked if it
// is not (nil, or released already). One release of the handle at a time (unlocking).
func (rw *RWMutex) release(ctx context.Context, op, span string, h *core.Hold, held **core.Hold, turn *core.Turn) (err error) {
	ctx, a := rw.wshell().Start(ctx, core.Release, span)
	defer func() { a.End(err) }()
	if h == nil {
		return rw.errorf(op, ErrNotLocked)
	}
	if err := rw.unlocking.Take(ctx); err != nil {
		return rw.errorf(op, err)
	}
	defer rw.unlocking.Give()
	rw.mu.Lock()
	current := *held == h
	rw.mu.Unlock()
	if !current {
		return rw.errorf(op, ErrNotLocked) // released before: by an Unlock, or fn in Do
	}
	_ = h.EndIfClientClosed()
	ended, err := h.Release(ctx)
	if ended {
		rw.mu.Lock()
		*held = nil
		rw.upgraded = rw.upgraded && rw.up != nil
		rw.mu.Unlock()
		turn.Give()
	}
	if err != nil {
		return rw.errorf(op, err)
	}
	return nil
}
