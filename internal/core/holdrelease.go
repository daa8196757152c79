package core

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// releaseOutcome is what a release's fenced delete found.
type releaseOutcome int

const (
	notDone releaseOutcome = iota // no answer, or a refusal: the error says which
	deleted                       // this release deleted the key
	gone                          // a try found the key gone
)

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
	switch h.state {
	case lost:
		h.state = over
		err := h.err
		h.mu.Unlock()
		h.waitMonitor()
		h.settleLoss()
		return true, err
	case releasing, over:
		h.mu.Unlock()
		return false, ErrNotLocked
	}
	h.state, h.seen = releasing, nil
	h.mu.Unlock()

	out, err := h.deleteFenced(ctx)
	h.mu.Lock()
	seen := h.seen
	h.mu.Unlock()
	var final error
	switch {
	case out == deleted:
	case out == gone:
		final = errKeyGone(h.key)
	case seen != nil:
		final = seen // the session ended, or the key went, while the delete got no answer
	case h.sess.ended():
		// No try got through before the session ended: the hold is lost, and its key goes
		// with the lease (revoked once etcd answers, or expired).
		final = h.sess.lostErr()
	default:
		h.mu.Lock()
		h.state = held
		h.mu.Unlock()
		return false, fmt.Errorf("release %s: %w", h.key, err)
	}
	h.mu.Lock()
	h.end(over, final)
	h.mu.Unlock()
	h.waitMonitor()
	h.settleLoss()
	return true, final
}

// deleteFenced deletes the key if it is still the hold's: deleted if a try was seen to
// delete it, gone if a try found it gone (perhaps deleted by an earlier try of this call
// that got no answer), notDone with the error if none could tell. It stops trying once the
// session has ended: a release then blocks no longer than the session's local deadline,
// whatever ctx allows.
func (h *Hold) deleteFenced(ctx context.Context) (releaseOutcome, error) {
	var b backoff
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(h.sess.ctx, cancel)()
	for {
		if err := h.sess.lostErr(); err != nil {
			return notDone, err
		}
		if err := ctx.Err(); err != nil {
			return notDone, err
		}
		tctx, cancel := tryContext(ctx)
		sent := clockOf(h.cli).now()
		resp, err := h.cli.Txn(clientv3.WithRequireLeader(tctx)).If(h.IsOwner()).Then(clientv3.OpDelete(h.key)).Commit()
		tryEnded := tctx.Err() != nil
		cancel()
		if err == nil {
			if rw := clockOf(h.cli).linear(resp.Header, sent); rw != nil {
				rewind(h.cli, rw) // the hold was lost in the history that went: its session ends
				return notDone, fmt.Errorf("%w: %w", ErrLost, rw)
			}
		}
		switch {
		case err == nil && resp.Succeeded:
			return deleted, nil
		case err == nil:
			return gone, nil
		case ctx.Err() != nil || !transient(err) && !tryEnded:
			return notDone, err
		}
		if err := b.wait(ctx); err != nil {
			return notDone, err
		}
	}
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

func (c holdRelease) attempt(ctx context.Context) bool {
	ended, err := c.h.Release(ctx)
	return ended || errors.Is(err, ErrNotLocked)
}

func (c holdRelease) drop() { c.h.observe(fmt.Errorf("%w: %w", ErrLost, errClientClosed)) }
