package election

import (
	"context"
	"fmt"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Transfer hands this handle's leadership to the candidate whose value is to (the oldest
// of them if several have it), ahead of the candidates before it, who keep their order
// behind it. If a Run's lead runs on the leadership, Transfer first ends lead's ctx (its
// cause matches [ErrNotLocked]) and waits for lead to return; that Run then campaigns again,
// behind every candidate there is. The candidate takes the leader's key over, at its create
// revision: the fencing token passes with the key (see the package doc), and observers see
// one change, to the candidate's value. etcd's own concurrency.Election and `etcdctl elect`
// beside it keep waiting, as for any leader.
//
// Errors: [ErrNoCandidate] when no candidate of this package has the value to (the
// leadership is then untouched), or the candidate did not take the leadership over within 5 s
// of being handed it (a process of an older version of this module, or one whose Campaign
// ended meanwhile); then the leader takes its key back, and a Run's term, whose lead has
// returned, ends as by Resign. [ErrNotLeader] without leadership; [ErrLost] if it was lost.
// ctx's error, wrapped, when ctx ends while lead has not returned: the transfer is then still
// made once it does. On an Election not made by [New], an error matching [ErrInvalidOption]
// and ErrNotLeader.
//
// Cost: one Range to find the candidate, one Range and one Txn to hand over, and a watch
// until the candidate has accepted.
func (e *Election) Transfer(ctx context.Context, to string) (err error) {
	if e.queue() == nil {
		return e.errorf("transfer", fmt.Errorf("%w (%w)", e.queue().Unusable(), errNoLeadership))
	}
	ctx, a := e.tel.BeginRelease(ctx, "etcdsync.election.Transfer")
	defer func() { a.End(err) }()
	return e.transfer(ctx, e.current(), transferRequest{to: core.Match{Value: to}})
}

// transfer moves h, the handle's leadership, as r says: to a candidate, or, with
// r.stepDown, by a Resign; once the lead of a Run's term on h has returned.
func (e *Election) transfer(ctx context.Context, h *core.Hold, r transferRequest) error {
	_ = h.EndIfClientClosed()
	switch {
	case h == nil:
		return e.errorf("transfer", errNoLeadership)
	case !h.Live():
		return e.resign(ctx, h) // ErrLost, and forgotten, as by Resign
	}
	e.mu.Lock()
	t := e.term
	running := t != nil && t.h == h && !t.ended
	e.mu.Unlock()
	if running && !r.stepDown {
		// Before lead is ended for it: a transfer that cannot be made leaves lead alone.
		if err := e.q.HasCandidate(ctx, h, r.to); err != nil {
			return e.errorf("transfer", err)
		}
	}
	e.mu.Lock()
	if t := e.term; t != nil && t.h == h && !t.ended {
		if t.transfer != nil {
			e.mu.Unlock()
			return e.errorf("transfer", fmt.Errorf("%w: a transfer of this leadership is under way", ErrNotLeader))
		}
		r.done = make(chan error, 1)
		t.transfer = &r
		e.mu.Unlock()
		t.stop(errTransferring)
		select {
		case err := <-r.done:
			return err
		case <-ctx.Done():
			return e.errorf("transfer", fmt.Errorf("%w (the transfer is made once lead returns)", ctx.Err()))
		}
	}
	e.mu.Unlock()
	if r.stepDown {
		return e.resign(ctx, h)
	}
	return e.handOver(ctx, h, r.to)
}

// handOver hands h, the handle's leadership, to the candidate to matches, and forgets it
// once handed.
func (e *Election) handOver(ctx context.Context, h *core.Hold, to core.Match) error {
	if err := e.resigning.Take(ctx); err != nil {
		return e.errorf("transfer", err)
	}
	defer e.resigning.Give()
	if e.current() != h {
		return e.errorf("transfer", errNoLeadership)
	}
	if err := e.q.HandOver(ctx, h, to); err != nil {
		return e.errorf("transfer", err)
	}
	e.forget(h)
	return nil
}
