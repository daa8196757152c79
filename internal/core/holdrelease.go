package core

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
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
	busy := h.state == releasing || h.state == over
	h.mu.Unlock()
	if busy {
		return false, ErrNotLocked
	}
	ended, final, err := release(ctx, h.cli, h.sess, []*Hold{h})
	if !ended {
		return false, fmt.Errorf("release %s: %w", h.key, err)
	}
	h.settleLoss()
	return true, final
}

// release ends members, the holds of one acquisition on sess (one, or a Group's), none of
// them releasing or over unless lost: the keys of those held go in one fenced delete (see
// deleteFenced); those lost end as they are. ended reports that every member has ended,
// with final the first loss among them (nil: every key was deleted by this release). When
// the delete cannot be done, members whose loss was seen meanwhile end with it, the others
// are held again, and err says why; then ended is false.
func release(ctx context.Context, cli *clientv3.Client, sess *Session, members []*Hold) (ended bool, final, err error) {
	var live []*Hold
	for _, h := range members {
		h.mu.Lock()
		switch h.state {
		case held:
			h.state, h.seen = releasing, nil
			live = append(live, h)
		case lost:
			h.state = over
			fallthrough
		default: // over: lost, and seen by a release that could not finish
			final = firstErr(final, h.err)
		}
		h.mu.Unlock()
	}
	deleted, err := deleteFenced(ctx, cli, sess, live)
	kept := false
	for i, h := range live {
		var loss error
		h.mu.Lock()
		switch {
		case deleted != nil && !deleted[i]:
			loss = errKeyGone(h.key)
		case deleted != nil:
		case h.seen != nil:
			loss = h.seen // the session ended, or the key went, while the delete got no answer
		case sess.ended():
			// No try got through before the session ended: the hold is lost, and its key
			// goes with the lease (revoked once etcd answers, or expired).
			loss = sess.lostErr()
		default:
			h.state = held
			kept = true
			h.mu.Unlock()
			continue
		}
		h.end(over, loss)
		h.mu.Unlock()
		final = firstErr(final, loss)
	}
	if kept {
		return false, final, err
	}
	for _, h := range members {
		h.waitMonitor()
	}
	return true, final, nil
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// deleteFenced deletes the key of each of holds that is still its hold's, in one Txn (a
// compare on its create revision; for several keys, a nested Txn each, so that the answer
// says which it deleted), and reports which it deleted: a key not deleted was found gone
// (perhaps by an earlier try of this call that got no answer). nil, with the error, when no
// try could tell. It stops trying once the session has ended: a release then blocks no
// longer than the session's local deadline, whatever ctx allows.
func deleteFenced(ctx context.Context, cli *clientv3.Client, sess *Session, holds []*Hold) ([]bool, error) {
	if len(holds) == 0 {
		return []bool{}, nil
	}
	build := func(t clientv3.Txn) clientv3.Txn {
		if len(holds) == 1 {
			return t.If(holds[0].IsOwner()).Then(clientv3.OpDelete(holds[0].key))
		}
		ops := make([]clientv3.Op, len(holds))
		for i, h := range holds {
			ops[i] = fencedDelete(h.key, h.rev)
		}
		return t.Then(ops...)
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
		resp, err := build(cli.Txn(clientv3.WithRequireLeader(tctx))).Commit()
		tryEnded := tctx.Err() != nil
		cancelTry()
		if err == nil {
			if rw := clockOf(cli).linear(resp.Header, sent); rw != nil {
				rewind(cli, rw) // the holds were lost in the history that went: the session ends
				return nil, fmt.Errorf("%w: %w", ErrLost, rw)
			}
			deleted := make([]bool, len(holds))
			for i := range holds {
				if len(holds) == 1 {
					deleted[i] = resp.Succeeded
				} else {
					deleted[i] = resp.Responses[i].GetResponseTxn().GetSucceeded()
				}
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
