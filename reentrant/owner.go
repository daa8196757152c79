package reentrant

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/etcdsync/etcdsync/internal/core"
)

// releaseTimeout bounds a last Unlock whose context is already done: the owning context may
// itself be cancelled (by the loss of the hold, or by its parent) while the key still has to
// go. Long enough to ride out a leader election, short enough to keep Unlock prompt when
// etcd is unreachable; the count then stays at 1 and Unlock may be called again.
const releaseTimeout = 5 * time.Second

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

// exit counts one Unlock of o down. last is true when it was the last one, which must
// release the hold and then call released; ErrLost reports a hold lost before.
func (o *owner) exit() (last bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.count == 0:
		return false, fmt.Errorf("%w: the context's hold is released or being released", ErrNotLocked)
	case o.count > 1:
		o.count--
		return false, o.hold.Err()
	}
	o.count, o.releasing = 0, make(chan struct{})
	return true, nil
}

// release deletes the hold's key with a fenced delete (Hold.Release), on ctx or, when ctx
// is done already, on a detached context bounded by releaseTimeout.
func (o *owner) release(ctx context.Context) (ended bool, err error) {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	return o.hold.Release(ctx)
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

// endCause is the cause the owning context is cancelled with when its hold ends with err.
func endCause(err error) error {
	if err != nil {
		return ErrLost
	}
	return context.Canceled
}

// ownerValue is the value of a new owner's key: who holds the lock, since when and as which
// owner, for `etcdctl get` and `etcdsync status`.
func ownerValue() string { return core.OwnerValue("owner=" + uuid.NewString()) }
