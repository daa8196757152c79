package election

import (
	"context"
	"fmt"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Transfer hands this handle's leadership to the candidate whose value is to (the oldest
// of them if several have it), ahead of the candidates before it, who keep their order
// behind it. It asks that candidate first; only once it has answered (within 5 s) does
// Transfer end the lead's ctx of a Run on the leadership (its cause matches
// [ErrNotLocked]) and wait for lead to return; that Run then campaigns again, behind every
// candidate there is. The candidate takes the leader's key over, at its create revision:
// the fencing token passes with the key (see the package doc), and observers see one
// change, to the candidate's value. etcd's own concurrency.Election and `etcdctl elect`
// beside it keep waiting, as for any leader.
//
// Errors: [ErrNoCandidate] when no candidate of this package has the value to, or it did
// not answer (its process died, its key staying until its lease ends; an older version of
// this module): nothing changed but that candidate's place, and lead runs on. Also
// ErrNoCandidate when it answered but was gone before it took the leadership over: the
// leader leads on, and a Run calls lead again on the same leadership. [ErrNotLeader]
// without leadership; [ErrLost] if it was lost. ctx's error, wrapped, when ctx ends while
// lead has not returned: the transfer is then still made once it does. On an Election not
// made by [New], an error matching [ErrInvalidOption] and ErrNotLeader.
//
// Cost: one Range to find the candidate, two Txns and a watch until it answers, one Txn to
// hand over, and a watch until the candidate has accepted.
func (e *Election) Transfer(ctx context.Context, to string) (err error) {
	if s := e.shell(); s == unmade {
		return s.UnheldAs("transfer", errNoLeadership)
	}
	ctx, a := e.shell().Start(ctx, core.Release, "etcdsync.election.Transfer")
	defer func() { a.End(err) }()
	return e.transfer(ctx, e.current(), transferRequest{to: match{Value: to}})
}

// transfer moves h, the handle's leadership, as r says: to a candidate, or, with
// r.stepDown, by a Resign; once the lead of a Run's term on h has returned. A transfer to a
// candidate proposes it first (unless r's proposal was answered already), before lead is
// ended for it: a candidate that cannot take the leadership over leaves lead alone.
func (e *Election) transfer(ctx context.Context, h *core.Hold, r transferRequest) error {
	_ = h.EndIfClientClosed()
	switch {
	case h == nil:
		r.proposal.withdraw(ctx)
		return e.errorf("transfer", errNoLeadership)
	case !h.Live():
		r.proposal.withdraw(ctx)
		return e.resign(ctx, h) // ErrLost, and forgotten, as by Resign
	case e.transferring(h):
		r.proposal.withdraw(ctx)
		return e.errorf("transfer", errTransferUnderWay)
	}
	if !r.stepDown && r.proposal == nil {
		p, err := propose(ctx, e.s.Q, h, r.to)
		if err != nil {
			return e.errorf("transfer", err)
		}
		r.proposal = p
	}
	e.mu.Lock()
	if t := e.term; t != nil && t.h == h && !t.ended {
		if t.transfer != nil {
			e.mu.Unlock()
			r.proposal.withdraw(ctx)
			return e.errorf("transfer", errTransferUnderWay)
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
	return e.handOver(ctx, h, r.proposal)
}

// errTransferUnderWay is what a transfer of a Run's term that another transfer is moving
// already returns.
var errTransferUnderWay = fmt.Errorf("%w: a transfer of this leadership is under way", ErrNotLeader)

// transferring reports whether a transfer of h, a Run's term, is under way.
func (e *Election) transferring(h *core.Hold) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.term
	return t != nil && t.h == h && !t.ended && t.transfer != nil
}

// handOver hands h, the handle's leadership, to the candidate that answered p, and forgets
// it once handed; it withdraws p if it does not get to hand over.
func (e *Election) handOver(ctx context.Context, h *core.Hold, p *proposal) error {
	if err := e.resigning.Take(ctx); err != nil {
		p.withdraw(ctx)
		return e.errorf("transfer", err)
	}
	defer e.resigning.Give()
	if e.current() != h {
		p.withdraw(ctx)
		return e.errorf("transfer", errNoLeadership)
	}
	if err := p.handOver(ctx); err != nil {
		return e.errorf("transfer", err)
	}
	e.forget(h)
	return nil
}
