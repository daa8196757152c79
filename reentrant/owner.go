package reentrant

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/etcdsync/etcdsync/internal/core"
)

// releaseGrace is how long the last Unlock's release goes on past the end of its ctx: the
// owning context may itself be cancelled (by the loss of the hold, or by its parent), or a
// deadline pass, while the key still has to go. Long enough to ride out a leader election,
// short enough to keep Unlock prompt when etcd is unreachable; the count then stays at 1
// and Unlock may be called again.
const releaseGrace = 5 * time.Second

// ownerKey is the context key of an owner of the Mutex m: ownership is per handle.
type ownerKey struct{ m *Mutex }

// owner is one hold of a Mutex and its count of Locks, carried by the owning context.
type owner struct {
	hold *core.Hold

	mu        sync.Mutex
	count     int           // Locks not yet matched by an Unlock; 0 once released
	releasing chan struct{} // set while the last Unlock's release runs, closed when it ends
}

// enter counts one more Lock of o, once any release under way has ended: a Lock may only
// re-enter a hold that lasts, and never counts up a hold that its last Unlock is deleting.
func (o *owner) enter(ctx context.Context) error {
	for {
		o.mu.Lock()
		ch := o.releasing
		if ch == nil {
			break
		}
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer o.mu.Unlock()
	_ = o.hold.EndIfClientClosed()
	if o.count == 0 {
		if err := ctx.Err(); err != nil {
			return err // the release cancelled the owning context, and so ctx
		}
		// ctx derives from the owning context through context.WithoutCancel.
		return fmt.Errorf("%w: the context's hold was released", ErrNotLocked)
	}
	if err := o.hold.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	o.count++
	return nil
}

// exit counts one Unlock of o down, once any release under way has ended (waiting as long
// as the release itself could go on, see release). last is true when it was the last one,
// which must release the hold and then call released; ErrLost reports a hold lost before.
func (o *owner) exit(ctx context.Context) (last bool, err error) {
	for {
		o.mu.Lock()
		ch := o.releasing
		if ch == nil {
			break
		}
		o.mu.Unlock()
		if err := awaitRelease(ctx, ch); err != nil {
			return false, err
		}
	}
	defer o.mu.Unlock()
	switch {
	case o.count == 0:
		return false, fmt.Errorf("%w: the context's hold is released", ErrNotLocked)
	case o.count > 1:
		o.count--
		return false, o.hold.Err()
	}
	o.count, o.releasing = 0, make(chan struct{})
	return true, nil
}

// awaitRelease waits for another Unlock's release, whose end closes ch, for as long as a
// release of this Unlock's own could go on.
func awaitRelease(ctx context.Context, ch <-chan struct{}) error {
	rctx, cancel := core.Outlive(ctx, releaseGrace)
	defer cancel()
	select {
	case <-ch:
		return nil
	case <-rctx.Done():
		return fmt.Errorf("another Unlock's release of the hold is still under way: %w", ctx.Err())
	}
}

// release deletes the hold's key with a fenced delete (Hold.Release), on a context that
// outlives ctx by releaseGrace: a deadline that passes while the delete is in flight does
// not cut it short. A closed client ends the hold as lost at once.
func (o *owner) release(ctx context.Context) (ended bool, err error) {
	rctx, cancel := core.Outlive(ctx, releaseGrace)
	defer cancel()
	_ = o.hold.EndIfClientClosed()
	return o.hold.Release(rctx)
}

// released ends the release that exit began: the hold is over if ended, otherwise it
// stays with a count of 1, so that Unlock may be called again.
func (o *owner) released(ended bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.releasing)
	o.releasing = nil
	if !ended {
		o.count = 1
	}
}

func (o *owner) depth() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count
}

// endCause is the cause the owning context is cancelled with when its hold ends with err:
// the loss itself, which matches ErrLost (and ErrMaxHold or ErrReleasedByOperator when
// that is why), or context.Canceled after a release.
func endCause(err error) error {
	if err != nil {
		return err
	}
	return context.Canceled
}

// ownerValue is the value of a new owner's key: who holds the lock, since when and as which
// owner, for `etcdctl get` and `etcdsync status`.
func ownerValue() string { return core.OwnerValue("owner=" + uuid.NewString()) }
