package election

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/etcdsync/etcdsync/internal/core"
)

// An asker follows, for one leadership, what asks it to move: a request of the name
// ([Election.RequestTransfer], `etcdsync transfer`), and the candidates of a higher
// preference than the handle's ([WithPreference]) once one of them has waited a settle time
// and the leadership has lasted as long. Its goroutine reads the request and the candidates
// with a preference, then watches both, until it is asked, the leadership ends or the
// client closes.
type asker struct {
	h     *core.Hold    // the leadership it follows
	asked chan struct{} // closed once asked
	ask   transferRequest
	req   *mvccpb.KeyValue // the request that asked, to delete once answered; nil for none
}

// asking returns the asker of h, the handle's leadership, starting it if need be; nil
// without leadership.
func (e *Election) asking(h *core.Hold) *asker {
	e.mu.Lock()
	defer e.mu.Unlock()
	if h == nil || e.hold != h {
		return nil
	}
	if e.asker == nil || e.asker.h != h {
		ctx, cancel := context.WithCancel(e.s.Q.Client().Ctx())
		k := &asker{h: h, asked: make(chan struct{})}
		e.asker = k
		h.OnEnd(func(error) { cancel() })
		go e.follow(ctx, h, k)
	}
	return e.asker
}

// follow is the asker's goroutine (see asker): core's FollowAsks, which asks heed of a
// request, and proposes the transfer to a preferred candidate that has waited.
func (e *Election) follow(ctx context.Context, h *core.Hold, k *asker) {
	e.s.Q.FollowAsks(ctx, h, e.pref, e.settle,
		func(kv *mvccpb.KeyValue) bool { return e.heed(ctx, h, k, kv) },
		func(key string) (asked, gone bool) {
			to := match{Key: key}
			p, err := propose(ctx, e.s.Q, h, to)
			switch {
			case err == nil:
				k.ask = transferRequest{to: to, proposal: p}
				close(k.asked)
				return true, false
			case errors.Is(err, ErrNoCandidate):
				return false, true
			}
			return false, false
		})
}

// heed takes up the request kv: the asker is asked if the request can be done (true): a
// step-down, or a transfer to a candidate that answered its proposal; otherwise the
// request is answered, deleted, at once (a candidate it names is not there, or did not
// answer).
func (e *Election) heed(ctx context.Context, h *core.Hold, k *asker, kv *mvccpb.KeyValue) bool {
	r, ok := core.ParseTransferRequest(kv)
	if !ok || r.Key != h.Key() || r.Token != h.Token() {
		// Of another leadership: the leader it asked is gone, or handed this one its key
		// (and answers it itself); it asks nothing of this one.
		e.s.Q.AnswerTransfer(ctx, kv)
		return false
	}
	ask := transferRequest{stepDown: true}
	if r.To != nil {
		to := match{Value: *r.To}
		p, err := propose(ctx, e.s.Q, h, to)
		if err != nil {
			e.s.Q.AnswerTransfer(ctx, kv)
			return false
		}
		ask = transferRequest{to: to, proposal: p}
	}
	k.ask, k.req = ask, kv
	close(k.asked)
	return true
}

// Asked returns a channel that is closed once this handle's leadership is asked to move: by
// a request ([Election.RequestTransfer], `etcdsync transfer`), by an ask of its token
// (admin.Ask, `etcdsync ask`: a request to step down), or, with [WithPreference], by
// a candidate of a higher preference that has waited a settle time while the leadership
// lasted as long; for a transfer, only once the candidate named has answered that it takes
// the leadership over (see [Election.Transfer]), so a request to a candidate that is gone
// closes nothing. [Election.Run] heeds it by itself; a leader by Campaign that wants to
// heed it stops its work and calls [Election.Yield]. Without leadership the channel is nil
// (it never closes). After a Yield that failed, the leadership is asked anew: call Asked
// again for the channel.
//
// Cost: the first call on a leadership watches the request, the ask and the candidates
// with a preference, then reads them (a Range and one Txn), and follows both while it lasts; a
// proposal to a candidate costs what [Election.Transfer]'s does before lead is ended.
func (e *Election) Asked() <-chan struct{} {
	if e.shell() == unmade {
		return nil
	}
	if k := e.asking(e.current()); k != nil {
		return k.asked
	}
	return nil
}

// Yield does what [Election.Asked] asked: a [Election.Transfer] to the candidate named, or
// a [Election.Resign] for a request to step down, and answers the request. It returns nil,
// doing nothing, when nothing was asked.
//
// Errors: those of Transfer, or of Resign; [ErrNotLeader] without leadership.
func (e *Election) Yield(ctx context.Context) error {
	if s := e.shell(); s == unmade {
		return s.UnheldAs("yield", errNoLeadership)
	}
	h := e.current()
	k := e.asking(h)
	if k == nil {
		return e.errorf("yield", errNoLeadership)
	}
	select {
	case <-k.asked:
	default:
		return nil
	}
	return e.yield(ctx, h, k)
}

// yield does what k, the asker of h, was asked. If that fails, a leadership that leads on
// is asked anew: the next Asked follows it afresh.
func (e *Election) yield(ctx context.Context, h *core.Hold, k *asker) error {
	defer e.s.Q.AnswerTransfer(ctx, k.req)
	err := e.transfer(ctx, h, k.ask)
	if err != nil {
		e.mu.Lock()
		if e.asker == k {
			e.asker = nil
		}
		e.mu.Unlock()
	}
	return err
}

// RequestTransfer asks the leader of the name to transfer its leadership to the candidate
// whose value is to, or, with to "", to step down (the next candidate in line then leads), and
// returns the leader after the leader answered. A leader heeds it when it leads by
// [Election.Run], or watches [Election.Asked]; another never answers, and RequestTransfer
// waits until ctx ends. The request lies in etcd on this handle's lease, so it goes with its
// process.
//
// Errors: [ErrNoLeader] when nobody leads. [ErrNoCandidate] when, after the leader answered,
// the candidate to does not lead (none had that value, it did not answer, or it did not
// take over; see [Election.Transfer]), with the Leader that leads then, if any. An error
// when another request is pending. ctx's error, wrapped, when ctx ends first: the request is
// then withdrawn. [ErrInvalidOption]: e was not made by [New], or its client is closed.
//
// Cost: one Range, one Txn, a watch until the leader answers, and one Range.
func (e *Election) RequestTransfer(ctx context.Context, to string) (Leader, error) {
	if err := e.shell().Check("request transfer"); err != nil {
		return Leader{}, err
	}
	before, err := e.s.Q.Head(ctx)
	switch {
	case err != nil:
		return Leader{}, e.errorf("request transfer", err)
	case before.Token == 0:
		return Leader{}, e.errorf("request transfer", ErrNoLeader)
	}
	r := core.TransferRequest{Key: before.Key, Token: before.Token, By: core.OwnerValue("")}
	if to != "" {
		r.To = &to
	}
	if err := e.s.Q.AskTransfer(ctx, r); err != nil {
		return Leader{}, e.errorf("request transfer", err)
	}
	after, err := e.Leader(ctx)
	switch {
	case errors.Is(err, ErrNoLeader) && to != "":
		return Leader{}, e.errorf("request transfer", fmt.Errorf("%w: nobody leads (before: %q)", ErrNoCandidate, before.Value))
	case errors.Is(err, ErrNoLeader):
		return Leader{}, nil // stepped down, and nobody else was in line
	case err != nil:
		return Leader{}, err
	case to != "" && after.Value == before.Value && after.Token == before.Token:
		return after, e.errorf("request transfer", fmt.Errorf("%w: no candidate %q took the leadership over (none has that value, or it did not answer: its process is gone): %q leads on", ErrNoCandidate, to, after.Value))
	case to != "" && after.Value != to:
		return after, e.errorf("request transfer", fmt.Errorf("%w: %q leads (before: %q)", ErrNoCandidate, after.Value, before.Value))
	}
	return after, nil
}
