package rwmutex

import (
	"context"
	"errors"
	"slices"

	"github.com/etcdsync/etcdsync/internal/core"
)

// A hold that changes in place keeps its key, so its place in line and its create
// revision: a downgraded write hold and an upgradable read are write keys whose value says
// their mode (" mode=read", " mode=upgradable"; see the package doc).

// Downgrade turns this handle's write hold into a read hold in place: its key, its place in
// line and its create revision stay, so no writer queued behind it comes in between.
// Readers queued behind it up to the next waiting writer are served then; a writer queued
// behind it waits until it leaves. The read hold is the handle's oldest group of readers,
// with the caller its one member: release it with [RWMutex.RUnlock]. Other readers of the
// handle may join it as they join any read hold. The write hold is that of [RWMutex.Lock],
// else an upgraded read's ([RWMutex.Upgrade]), else the upgradable read itself, which then
// becomes a plain read.
//
// Inside [RWMutex.Do]'s fn, Do then leaves that read hold as an RUnlock would.
//
// The write hold ends when Downgrade sends its write: Token is then 0 and IsOwner never
// succeeds, but a compare taken from IsOwner before still does while the read hold lasts
// (the key is the same), so every write guarded by it must be done or abandoned first.
//
// Errors: [ErrNotLocked] without a write or upgradable hold. [ErrLost] if the hold was lost
// (it is not changed: Unlock, or UUnlock, reports the loss as ever). ctx's error with ctx
// done already, having sent nothing. When etcd cannot be reached before ctx ends the
// outcome is not known: the hold is a read hold all the same (safe either way: if etcd did
// not take the change, readers behind it wait until it leaves), and the error says why.
// [ErrInvalidOption] while a waiter of etcd's recipe.RWMutex is queued behind the hold
// (see the package doc), having written nothing: the hold is as it was. On an RWMutex not
// made by [New], an error matching [ErrInvalidOption] and ErrNotLocked.
//
// Cost: a read of the name's keys, and one Txn, which reads them again (one more for every
// key that came between the two).
func (rw *RWMutex) Downgrade(ctx context.Context) error {
	if s := rw.wshell(); s == unmade {
		return s.Unheld("downgrade")
	}
	if err := rw.unlocking.Take(ctx); err != nil {
		return rw.errorf("downgrade", err)
	}
	defer rw.unlocking.Give()
	rw.mu.Lock()
	h, upgradable := rw.write, false
	if h == nil {
		h, upgradable = rw.up, true
	}
	rw.mu.Unlock()
	switch {
	case h == nil:
		return rw.errorf("downgrade", ErrNotLocked)
	case ctx.Err() != nil:
		return rw.errorf("downgrade", ctx.Err())
	}
	if loss := h.EndIfClientClosed(); loss != nil {
		return rw.errorf("downgrade", loss)
	}
	if !h.Live() {
		return rw.errorf("downgrade", h.Err())
	}
	_, _, _, err := rw.w.Q.ChangeMode(ctx, h, core.WithMode(core.OwnerValue(""), core.ModeRead))
	if errors.Is(err, ErrLost) || errors.Is(err, core.ErrRecipeBehind) {
		return rw.errorf("downgrade", err) // lost; or nothing written, the hold as it was
	}
	rw.mu.Lock()
	if upgradable {
		rw.up, rw.upgraded = nil, false
	} else {
		rw.write = nil
	}
	g := &group{queued: core.Closed, ready: core.Closed, cancel: func() {}, hold: h, members: 1}
	rw.groups = slices.Insert(rw.groups, 0, g) // every other group is behind its key
	rw.mu.Unlock()
	if upgradable {
		rw.uturn.Give()
	} else {
		rw.turn.Give()
	}
	if err != nil {
		return rw.errorf("downgrade", err)
	}
	return nil
}

// ULock waits until the upgradable read is held: a read that may become the write hold in
// place ([RWMutex.Upgrade]). It holds beside readers and never beside a writer, and one at
// a time per name: it waits behind every writer and upgradable read queued before it,
// whatever handle or client; readers queued after it are served beside it. Its key is a
// write key, so etcd's recipe.RWMutex (and etcdsync of versions before upgradable reads)
// take it for a writer: their readers wait for it. One ULock of a handle at a time: another
// waits for its UUnlock (or Downgrade). Release it with [RWMutex.UUnlock].
//
// Like a writer's Lock, a goroutine that holds a read lock of the handle must not Upgrade:
// Upgrade waits for every reader admitted before it, that one too.
//
// Errors: as for [RWMutex.Lock].
//
// Cost: one Txn uncontended (which reads the write keys with their values).
func (rw *RWMutex) ULock(ctx context.Context) (err error) {
	ctx, a, err := rw.wshell().Begin(ctx, core.Wait, "ulock", "etcdsync.rwmutex.ULock")
	if err != nil {
		return err
	}
	defer func() { a.End(err) }()
	if err := rw.uturn.Take(ctx); err != nil {
		return rw.errorf("ulock", err)
	}
	spec := upgradableSpec()
	spec.Tel = rw.w.Tel
	h, err := rw.w.Q.Acquire(ctx, spec, nil)
	a.Held(h)
	if err != nil {
		rw.uturn.Give()
		return rw.errorf("ulock", err)
	}
	rw.mu.Lock()
	rw.up = h
	rw.mu.Unlock()
	return nil
}

// TryULock takes the upgradable read only if no writer or upgradable read holds the lock
// or waits for it, and this handle has none.
//
// Errors: [ErrLocked] otherwise, having written nothing. ctx's error and [ErrInvalidOption]
// as for [RWMutex.Lock].
//
// Cost: one Txn when no write key is there; else a read, and a Txn if only holds that are
// reads now are.
func (rw *RWMutex) TryULock(ctx context.Context) (err error) {
	ctx, a, err := rw.wshell().Begin(ctx, core.Try, "try ulock", "etcdsync.rwmutex.TryULock")
	if err != nil {
		return err
	}
	defer func() { a.End(err) }()
	if !rw.uturn.TryTake() {
		return rw.errorf("try ulock", ErrLocked)
	}
	rw.mu.Lock()
	writer := rw.write != nil || rw.wpending != nil
	rw.mu.Unlock()
	if writer {
		rw.uturn.Give()
		return rw.errorf("try ulock", ErrLocked)
	}
	h, err := rw.w.Q.TryAcquire(ctx, upgradableSpec())
	a.Held(h)
	if err != nil {
		rw.uturn.Give()
		return rw.errorf("try ulock", err)
	}
	rw.mu.Lock()
	rw.up = h
	rw.mu.Unlock()
	return nil
}

// UUnlock releases the upgradable read, upgraded or not, as [RWMutex.Unlock] releases the
// write lock, with its errors and cost: [ErrNotLocked] without an upgradable read.
func (rw *RWMutex) UUnlock(ctx context.Context) error {
	if s := rw.wshell(); s == unmade {
		return s.Unheld("uunlock")
	}
	rw.mu.Lock()
	h := rw.up
	rw.mu.Unlock()
	return rw.uunlock(ctx, "uunlock", h)
}

// uunlock releases h if it is still the handle's upgradable read; ErrNotLocked if not.
func (rw *RWMutex) uunlock(ctx context.Context, op string, h *core.Hold) error {
	return rw.release(ctx, op, "etcdsync.rwmutex.UUnlock", h, &rw.up, &rw.uturn)
}

// Upgrade turns the upgradable read into the write hold in place. It first marks its key
// upgrading, so that readers arriving from then on queue behind it, and returns once every
// read hold admitted before that has left: those queued before its key, and those after it
// that no waiting writer was ahead of; then its key is a writer's. Its token is its key's
// create revision, as a writer's: strictly above every writer's before it and below every
// writer's after it. Token, IsOwner and Done are then the write hold's; release it with
// [RWMutex.Unlock] or UUnlock, or Downgrade it. An upgraded hold upgrades at once. See
// docs/guarantees.md for how every client agrees on the readers it waits for.
//
// Errors: [ErrNotLocked] without an upgradable read. [ErrLost] if it was lost first, or
// while Upgrade waited (UUnlock reports it as ever). ctx's error when ctx ends before the
// readers have left: the hold is then an upgradable read again (its mode is put back,
// within a few seconds; if etcd cannot be reached for that, its key stays upgrading and
// new readers wait behind it until it upgrades or leaves). [ErrInvalidOption] while a
// waiter of etcd's recipe.RWMutex is queued behind it (see the package doc): it stays an
// upgradable read (its key keeps the upgrading mode if the recipe's waiter came during the
// wait). On an RWMutex not made by [New], an error matching [ErrInvalidOption] and
// ErrNotLocked.
//
// Cost: a read of the name's keys and one Txn that reads them again, a registration with
// the client's watch of the name until the readers have left, and one Txn (again if a
// writer that kept readers out left, or a key came, meanwhile).
func (rw *RWMutex) Upgrade(ctx context.Context) (err error) {
	if s := rw.wshell(); s == unmade {
		return s.Unheld("upgrade")
	}
	ctx, a := rw.wshell().Start(ctx, core.Wait, "etcdsync.rwmutex.Upgrade")
	defer func() { a.End(err) }()
	if err := rw.unlocking.Take(ctx); err != nil {
		return rw.errorf("upgrade", err)
	}
	defer rw.unlocking.Give()
	rw.mu.Lock()
	h, upgraded := rw.up, rw.upgraded
	rw.mu.Unlock()
	switch {
	case h == nil:
		return rw.errorf("upgrade", ErrNotLocked)
	case upgraded:
		return nil
	}
	if loss := h.EndIfClientClosed(); loss != nil {
		return rw.errorf("upgrade", loss)
	}
	if !h.Live() {
		return rw.errorf("upgrade", h.Err())
	}
	if err := rw.w.Q.Upgrade(ctx, h); err != nil {
		return rw.errorf("upgrade", err)
	}
	a.Held(h)
	rw.mu.Lock()
	rw.upgraded = true
	rw.mu.Unlock()
	return nil
}
