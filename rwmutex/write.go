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

// Lock waits until the write lock is held: until no key, read or write, is ahead of its
// key. Readers of this handle that arrive meanwhile queue behind it. If ctx ends first it
// returns ctx's error, wrapped, after deleting its key (see mutex.Mutex.Lock for the
// details, which are the same, a done ctx and ErrInvalidOption included).
//
// Like a sync.RWMutex, a handle's write side stays taken from Lock to Unlock, also when
// the hold was lost in between: call Unlock (it returns ErrLost) before Lock again.
func (rw *RWMutex) Lock(ctx context.Context) (err error) {
	if err := rw.queue().Unusable(); err != nil {
		return rw.errorf("lock", err)
	}
	ctx, a := rw.wtel.BeginWait(ctx, "etcdsync.rwmutex.Lock")
	defer func() { a.End(err) }()
	select {
	case rw.turn <- struct{}{}:
	case <-ctx.Done():
		return rw.errorf("lock", ctx.Err())
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
		spec.Tel = rw.wtel
		h, err = rw.q.Acquire(ctx, spec, nil)
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
		<-rw.turn
		return rw.errorf("lock", err)
	}
	return nil
}

// TryLock takes the write lock only if nobody holds the lock or waits for it, reader or
// writer; otherwise, or if this handle holds or waits already, it returns ErrLocked having
// written nothing. One Txn, none when this handle's own readers are in the way. A done
// ctx and ErrInvalidOption as for mutex.Mutex.TryLock.
func (rw *RWMutex) TryLock(ctx context.Context) (err error) {
	if err := rw.queue().Unusable(); err != nil {
		return rw.errorf("try lock", err)
	}
	ctx, a := rw.wtel.BeginTry(ctx, "etcdsync.rwmutex.TryLock")
	defer func() { a.End(err) }()
	select {
	case rw.turn <- struct{}{}:
	default:
		return rw.errorf("try lock", ErrLocked)
	}
	rw.mu.Lock()
	readers := len(rw.groups) > 0
	rw.mu.Unlock()
	if readers {
		<-rw.turn
		return rw.errorf("try lock", ErrLocked)
	}
	h, err := rw.q.TryAcquire(ctx, writeSpec())
	a.Held(h)
	if err != nil {
		<-rw.turn
		return rw.errorf("try lock", err)
	}
	rw.mu.Lock()
	rw.write = h
	rw.mu.Unlock()
	return nil
}

// Unlock releases the write lock: one Txn that deletes the key only while its create
// revision is still this hold's. It returns ErrNotLocked without a write hold, and ErrLost
// (the hold has ended all the same) if the hold was lost before, or if the client is
// closed. If etcd cannot be reached before ctx ends, or ctx is done already, the lock stays
// held and Unlock may be called again. Concurrent Unlocks and a handle not made by New as
// for mutex.Mutex.Unlock.
func (rw *RWMutex) Unlock(ctx context.Context) (err error) {
	if rw.queue() == nil {
		return rw.errorf("unlock", core.Unheld(rw.queue().Unusable()))
	}
	ctx, a := rw.wtel.BeginRelease(ctx, "etcdsync.rwmutex.Unlock")
	defer func() { a.End(err) }()
	h := rw.writeHold()
	if h == nil {
		return rw.errorf("unlock", ErrNotLocked)
	}
	if err := core.TakeTurn(ctx, rw.unlocking); err != nil {
		return rw.errorf("unlock", err)
	}
	defer func() { <-rw.unlocking }()
	if rw.writeHold() != h {
		return rw.errorf("unlock", ErrNotLocked) // the Unlock before this one released it
	}
	_ = h.EndIfClientClosed()
	ended, err := h.Release(ctx)
	if ended {
		rw.mu.Lock()
		rw.write = nil
		rw.mu.Unlock()
		<-rw.turn
	}
	if err != nil {
		return rw.errorf("unlock", err)
	}
	return nil
}

func (rw *RWMutex) writeHold() *core.Hold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.write
}
