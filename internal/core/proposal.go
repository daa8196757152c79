package core

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The first step of a handover (see handover.go): the leader proposes it to the candidate
// chosen, which answers while the leader's work still runs.

// A Proposal is a handover of a leadership that the candidate chosen has said it takes
// (Queue.Propose). The leader stops its work, then hands over (Queue.HandOver), or
// withdraws it (Withdraw); a leadership that ends first withdraws it by itself.
type Proposal struct {
	q       *Queue
	h       *Hold
	own, x  *mvccpb.KeyValue // the leader's key and the candidate's, as read before
	rec     string           // the record's key
	created int64            // the record's create revision
	answer  int64            // the mod revision of the candidate's answer
	settled atomic.Bool      // handed over, or withdrawn: nothing is left to withdraw
}

// record is the value of p's record at stage.
func (p *Proposal) record(stage string) string {
	val, _ := json.Marshal(handoverRecord{Key: p.h.key, Token: p.h.rev, Stage: stage})
	return string(val)
}

// Propose asks the candidate to matches (see findCandidate) whether it takes h, a
// leadership, over, and returns once it has said it does: h may then stop its work and
// hand over. Errors: ErrNoCandidate when there is none, or it did not answer within
// handoverWait (its key is then gone, and h untouched); ErrLost when h's key is not its
// own; ctx's error; etcd's: h leads on in every case. Cost: one Range, one Txn, a watch of
// the record until the candidate answers, and one Txn.
func (q *Queue) Propose(ctx context.Context, h *Hold, to Match) (*Proposal, error) {
	if !h.Live() {
		return nil, errKeyGone(h.key)
	}
	for try := 0; ; try++ {
		own, x, err := q.findCandidate(ctx, h, to)
		if err != nil {
			return nil, err
		}
		p := &Proposal{q: q, h: h, own: own, x: x, rec: HandoverRecordKey(q.prefix, string(x.Key))}
		resp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
				If(h.IsOwner(),
					clientv3.Compare(clientv3.LeaseValue(h.key), "=", h.sess.Lease()),
					clientv3.Compare(clientv3.CreateRevision(string(x.Key)), "=", x.CreateRevision)).
				Then(clientv3.OpDelete(string(x.Key)),
					clientv3.OpPut(p.rec, p.record(stageProposed), clientv3.WithLease(h.sess.Lease()))).
				Else(clientv3.OpGet(p.rec)).
				Commit()
		})
		switch {
		case err != nil && refused(err):
			return nil, fmt.Errorf("propose to hand %s over: %w", h.key, err)
		case err != nil:
			// It may be applied, now or later: the janitor withdraws it then.
			janitorOf(q.cli).add(p.withdrawal())
			return nil, fmt.Errorf("propose to hand %s over: %w", h.key, err)
		}
		p.created = resp.Header.Revision
		proposed, answered := p.created, false
		if !resp.Succeeded {
			// A try whose answer was lost may have been applied: the record is then there,
			// on h's lease, and perhaps answered already.
			recs := resp.Responses[0].GetResponseRange().Kvs
			if len(recs) != 1 || clientv3.LeaseID(recs[0].Lease) != h.sess.Lease() || !p.names(recs[0]) {
				if try < 2 {
					continue // h's key went, or the candidate left: read again
				}
				return nil, fmt.Errorf("%w: the candidate %v kept changing", ErrNoCandidate, to)
			}
			r, _ := parseRecord(recs[0], q.prefix)
			p.created, proposed, answered = recs[0].CreateRevision, recs[0].ModRevision, r.Stage == stageReady
		}
		// A leadership that ends before it hands over withdraws the proposal.
		j := janitorOf(q.cli)
		h.OnEnd(func(error) {
			if !p.settled.Swap(true) {
				j.add(p.withdrawal())
			}
		})
		if answered {
			p.answer = proposed
			return p, nil
		}
		return p, p.awaitAnswer(ctx, proposed, to)
	}
}

// names reports whether kv is a record of p's, proposed or answered.
func (p *Proposal) names(kv *mvccpb.KeyValue) bool {
	r, ok := parseRecord(kv, p.q.prefix)
	return ok && r.Key == p.h.key && r.Token == p.h.rev && (r.Stage == stageProposed || r.Stage == stageReady)
}

// awaitAnswer waits up to handoverWait for the candidate to answer p, proposed at revision
// proposed, and withdraws p if it has not by then, or ctx ended.
func (p *Proposal) awaitAnswer(ctx context.Context, proposed int64, to Match) error {
	cli := p.q.cli
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), handoverWait)
	_, _ = awaitGone(wctx, cli, &mvccpb.KeyValue{Key: []byte(p.rec), CreateRevision: p.created, ModRevision: proposed}, nil, true)
	cancel()
	if ctx.Err() != nil {
		p.Withdraw(ctx)
		return ctx.Err()
	}
	// Whatever the watch said, this Txn decides: p is withdrawn unless the candidate answered.
	dctx, dcancel := Detached(ctx)
	defer dcancel()
	resp, err := retry(dctx, func(dctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(dctx)).
			If(clientv3.Compare(clientv3.ModRevision(p.rec), "=", proposed)).
			Then(clientv3.OpDelete(p.rec)).
			Else(clientv3.OpGet(p.rec)).
			Commit()
	})
	switch {
	case err != nil:
		p.Withdraw(ctx)
		return fmt.Errorf("propose to hand %s over: %w", p.h.key, err)
	case resp.Succeeded:
		p.settled.Store(true)
		return fmt.Errorf("%w: the candidate %v did not answer within %v (its process is gone, and its key stays until its lease ends; or it runs an older etcdsync)", ErrNoCandidate, to, handoverWait)
	}
	if recs := resp.Responses[0].GetResponseRange().Kvs; len(recs) == 1 && recs[0].CreateRevision == p.created {
		if r, ok := parseRecord(recs[0], p.q.prefix); ok && r.Stage == stageReady {
			p.answer = recs[0].ModRevision
			return nil
		}
	}
	p.Withdraw(ctx)
	return fmt.Errorf("%w: the candidate %v gave its answer up (its Campaign ended)", ErrNoCandidate, to)
}

// Withdraw takes p back, unless its key was handed over: the candidate stops waiting (its
// Campaign fails with ErrLost, as its key went with the proposal), and a HandOver of p
// fails. One Txn; the janitor goes on with it if etcd does not answer.
func (p *Proposal) Withdraw(ctx context.Context) {
	if p == nil || p.settled.Swap(true) {
		return
	}
	w := p.withdrawal()
	dctx, cancel := Detached(ctx)
	defer cancel()
	if !w.attempt(dctx) {
		janitorOf(p.q.cli).add(w)
	}
}

func (p *Proposal) withdrawal() *withdrawal {
	return &withdrawal{cli: p.q.cli, p: p, lease: p.h.sess.Lease(), created: p.created}
}

// A withdrawal is the chore of deleting the record of a proposal that was not handed over:
// only while it is on the leader's lease (a handover moves it onto the candidate's), and at
// its create revision; when that is not known (the proposal got no answer), only if it
// names the leader's key and token.
type withdrawal struct {
	cli     *clientv3.Client
	p       *Proposal
	lease   clientv3.LeaseID
	created int64 // 0 if not known
}

func (w *withdrawal) attempt(ctx context.Context) bool {
	rec := w.p.rec
	if w.created == 0 {
		resp, err := w.cli.Get(clientv3.WithRequireLeader(ctx), rec)
		switch {
		case err != nil:
			return refused(err)
		case len(resp.Kvs) == 0 || clientv3.LeaseID(resp.Kvs[0].Lease) != w.lease || !w.p.names(resp.Kvs[0]):
			return true
		}
		w.created = resp.Kvs[0].CreateRevision
	}
	_, err := w.cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(rec), "=", w.created),
			clientv3.Compare(clientv3.LeaseValue(rec), "=", w.lease)).
		Then(clientv3.OpDelete(rec)).
		Commit()
	return err == nil || refused(err)
}

func (w *withdrawal) drop() {} // the client is closed: the record goes with the leader's lease
