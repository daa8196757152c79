package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The leader's side of a handover (Transfer, and the asker's proposals): propose it to the
// candidate chosen, hand the key over once it answered, await its acceptance or take the
// key back. The protocol, its record and the candidate's side are the core's (see
// internal/core/handover.go): a candidate answers and accepts within its acquisition.

// A proposal is a handover of a leadership that the candidate chosen has said it takes
// (propose). The leader stops its work, then hands over (handOver), or withdraws it
// (withdraw); a leadership that ends first withdraws it by itself.
type proposal struct {
	q       *core.Queue
	h       *core.Hold
	own, x  *mvccpb.KeyValue // the leader's key and the candidate's, as read before
	rec     string           // the record's key
	created int64            // the record's create revision
	answer  int64            // the mod revision of the candidate's answer
	settled atomic.Bool      // handed over, or withdrawn: nothing is left to withdraw
}

// record is the value of p's record at stage.
func (p *proposal) record(stage string) string {
	val, _ := json.Marshal(core.HandoverRecord{Key: p.h.Key(), Token: p.h.Token(), Stage: stage})
	return string(val)
}

// propose asks the candidate that to matches (see findCandidate) whether it takes h, a
// leadership, over, and returns once it has said it does: h may then stop its work and
// hand over. Errors: ErrNoCandidate when there is none, or it did not answer within
// core.HandoverWait (its key is then gone, and h untouched); ErrLost when h's key is not its
// own; ctx's error; etcd's: h leads on in every case. Cost: one Range, one Txn, a watch of
// the record until the candidate answers, and one Txn.
func propose(ctx context.Context, q *core.Queue, h *core.Hold, to match) (*proposal, error) {
	if !h.Live() {
		return nil, core.KeyGone(h.Key())
	}
	for try := 0; ; try++ {
		own, x, err := findCandidate(ctx, q, h, to)
		if err != nil {
			return nil, err
		}
		p := &proposal{q: q, h: h, own: own, x: x, rec: core.HandoverRecordKey(q.Prefix(), string(x.Key))}
		resp, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return q.Client().Txn(clientv3.WithRequireLeader(ctx)).
				If(h.IsOwner(),
					clientv3.Compare(clientv3.LeaseValue(h.Key()), "=", h.Lease()),
					clientv3.Compare(clientv3.CreateRevision(string(x.Key)), "=", x.CreateRevision)).
				Then(clientv3.OpDelete(string(x.Key)),
					clientv3.OpPut(p.rec, p.record(core.StageProposed), clientv3.WithLease(h.Lease()))).
				Else(clientv3.OpGet(p.rec)).
				Commit()
		})
		switch {
		case err != nil && core.Refused(err):
			return nil, fmt.Errorf("propose to hand %s over: %w", h.Key(), err)
		case err != nil:
			// It may be applied, now or later: the janitor withdraws it then.
			core.Tidy(q.Client(), p.withdrawal().attempt)
			return nil, fmt.Errorf("propose to hand %s over: %w", h.Key(), err)
		}
		p.created = resp.Header.Revision
		proposed, answered := p.created, false
		if !resp.Succeeded {
			// A try whose answer was lost may have been applied: the record is then there,
			// on h's lease, and perhaps answered already.
			recs := resp.Responses[0].GetResponseRange().Kvs
			if len(recs) != 1 || clientv3.LeaseID(recs[0].Lease) != h.Lease() || !p.names(recs[0]) {
				if try < 2 {
					continue // h's key went, or the candidate left: read again
				}
				return nil, fmt.Errorf("%w: the candidate %v kept changing", ErrNoCandidate, to)
			}
			r, _ := core.ParseHandoverRecord(recs[0], q.Prefix())
			p.created, proposed, answered = recs[0].CreateRevision, recs[0].ModRevision, r.Stage == core.StageReady
		}
		// A leadership that ends before it hands over withdraws the proposal.
		cli := q.Client()
		h.OnEnd(func(error) {
			if !p.settled.Swap(true) {
				core.Tidy(cli, p.withdrawal().attempt)
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
func (p *proposal) names(kv *mvccpb.KeyValue) bool {
	r, ok := core.ParseHandoverRecord(kv, p.q.Prefix())
	return ok && r.Key == p.h.Key() && r.Token == p.h.Token() && (r.Stage == core.StageProposed || r.Stage == core.StageReady)
}

// awaitAnswer waits up to core.HandoverWait for the candidate to answer p, proposed at revision
// proposed, and withdraws p if it has not by then, or ctx ended.
func (p *proposal) awaitAnswer(ctx context.Context, proposed int64, to match) error {
	cli := p.q.Client()
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), core.HandoverWait)
	_, _ = core.AwaitGone(wctx, cli, &mvccpb.KeyValue{Key: []byte(p.rec), CreateRevision: p.created, ModRevision: proposed}, nil, true)
	cancel()
	if ctx.Err() != nil {
		p.withdraw(ctx)
		return ctx.Err()
	}
	// Whatever the watch said, this Txn decides: p is withdrawn unless the candidate answered.
	dctx, dcancel := core.Detached(ctx)
	defer dcancel()
	resp, err := core.Retry(dctx, func(dctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(dctx)).
			If(clientv3.Compare(clientv3.ModRevision(p.rec), "=", proposed)).
			Then(clientv3.OpDelete(p.rec)).
			Else(clientv3.OpGet(p.rec)).
			Commit()
	})
	switch {
	case err != nil:
		p.withdraw(ctx)
		return fmt.Errorf("propose to hand %s over: %w", p.h.Key(), err)
	case resp.Succeeded:
		p.settled.Store(true)
		return fmt.Errorf("%w: the candidate %v did not answer within %v (its process is gone, and its key stays until its lease ends; or it runs an older etcdsync)", ErrNoCandidate, to, core.HandoverWait)
	}
	if recs := resp.Responses[0].GetResponseRange().Kvs; len(recs) == 1 && recs[0].CreateRevision == p.created {
		if r, ok := core.ParseHandoverRecord(recs[0], p.q.Prefix()); ok && r.Stage == core.StageReady {
			p.answer = recs[0].ModRevision
			return nil
		}
	}
	p.withdraw(ctx)
	return fmt.Errorf("%w: the candidate %v gave its answer up (its Campaign ended)", ErrNoCandidate, to)
}

// withdraw takes p back, unless its key was handed over: the candidate stops waiting (its
// Campaign fails with ErrLost, as its key went with the proposal), and a handOver of p
// fails. One Txn; the janitor goes on with it if etcd does not answer.
func (p *proposal) withdraw(ctx context.Context) {
	if p == nil || p.settled.Swap(true) {
		return
	}
	w := p.withdrawal()
	dctx, cancel := core.Detached(ctx)
	defer cancel()
	if !w.attempt(dctx) {
		core.Tidy(p.q.Client(), w.attempt)
	}
}

func (p *proposal) withdrawal() *withdrawal {
	return &withdrawal{cli: p.q.Client(), p: p, lease: p.h.Lease(), created: p.created}
}

// A withdrawal is the chore of deleting the record of a proposal that was not handed over:
// only while it is on the leader's lease (a handover moves it onto the candidate's), and at
// its create revision; when that is not known (the proposal got no answer), only if it
// names the leader's key and token.
type withdrawal struct {
	cli     *clientv3.Client
	p       *proposal
	lease   clientv3.LeaseID
	created int64 // 0 if not known
}

// attempt tries once; done when the record is gone or not the proposal's (a core.Tidy chore;
// if the client closes first, the record goes with the leader's lease).
func (w *withdrawal) attempt(ctx context.Context) (done bool) {
	rec := w.p.rec
	if w.created == 0 {
		resp, err := w.cli.Get(clientv3.WithRequireLeader(ctx), rec)
		switch {
		case err != nil:
			return core.Refused(err)
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
	return err == nil || core.Refused(err)
}

// A match picks the candidate a transfer goes to: the one with key Key if Key is set, else
// the oldest whose value is Value.
type match struct {
	Key, Value string
}

func (m match) String() string {
	if m.Key != "" {
		return fmt.Sprintf("with key %q", m.Key)
	}
	return fmt.Sprintf("%q", m.Value)
}

func (m match) matches(kv *mvccpb.KeyValue) bool {
	if m.Key != "" {
		return string(kv.Key) == m.Key
	}
	return string(kv.Value) == m.Value
}

// findCandidate reads the name, linearizably: own is h's key if it is still h's and on its
// lease, and x the oldest other key that to matches and that takes a handover. ErrLost if
// h's key is not; ErrNoCandidate, saying what there is, if no key is x. One Range.
func findCandidate(ctx context.Context, q *core.Queue, h *core.Hold, to match) (own, x *mvccpb.KeyValue, err error) {
	resp, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return q.Client().Get(clientv3.WithRequireLeader(ctx), q.Prefix(), clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the candidates: %w", err)
	}
	foreign := false
	for _, kv := range resp.Kvs {
		switch {
		case string(kv.Key) == h.Key():
			own = kv
		case x != nil || !to.matches(kv):
		case q.HandsOver(string(kv.Key)):
			x = kv
		default:
			foreign = true
		}
	}
	switch {
	case own == nil || own.CreateRevision != h.Token() || clientv3.LeaseID(own.Lease) != h.Lease():
		gone := core.KeyGone(h.Key())
		h.Lose(gone)
		return nil, nil, gone
	case x == nil && foreign:
		return nil, nil, fmt.Errorf("%w: the candidate %v is not etcdsync's (etcd's own Election cannot take a handover)", ErrNoCandidate, to)
	case x == nil:
		return nil, nil, fmt.Errorf("%w: no candidate %v", ErrNoCandidate, to)
	}
	return own, x, nil
}

// handOver hands p's leadership to its candidate, which answered, and ends the leadership
// once the candidate has accepted. Errors: ErrNoCandidate when the candidate gave its
// answer up since, or did not accept within core.HandoverWait (the leader then has its key
// back); ErrLost when the leader's key is not its own; etcd's: a refusal leaves the leader
// leading, an answer that did not come ends its leadership (the handover may be applied
// later). Cost: one Txn, a watch of the record until the candidate accepts, and one Txn
// more to take the key back if it does not.
func (p *proposal) handOver(ctx context.Context) error {
	q, h, x := p.q, p.h, p.x
	if !h.Live() {
		p.withdraw(ctx)
		return core.KeyGone(h.Key())
	}
	resp, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.Client().Txn(clientv3.WithRequireLeader(ctx)).
			If(h.IsOwner(),
				clientv3.Compare(clientv3.LeaseValue(h.Key()), "=", h.Lease()),
				clientv3.Compare(clientv3.ModRevision(p.rec), "=", p.answer)).
			Then(clientv3.OpPut(h.Key(), string(x.Value), clientv3.WithLease(clientv3.LeaseID(x.Lease))),
				clientv3.OpPut(p.rec, p.record(""), clientv3.WithLease(clientv3.LeaseID(x.Lease)))).
			Else(clientv3.OpGet(h.Key()), clientv3.OpGet(p.rec)).
			Commit()
	})
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		p.withdraw(ctx)
		return fmt.Errorf("%w: the lease of the candidate %q ended after it answered", ErrNoCandidate, x.Value)
	case err != nil && core.Refused(err):
		p.withdraw(ctx)
		return fmt.Errorf("hand %s over: %w", h.Key(), err) // not applied: the leader leads on
	case err != nil:
		// It may have been applied, or be applied later: this leadership is over.
		p.settled.Store(true)
		giveUp(ctx, h, err, clientv3.OpTxn([]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(p.rec), "=", p.created),
			clientv3.Compare(clientv3.LeaseValue(p.rec), "=", h.Lease())},
			[]clientv3.Op{clientv3.OpDelete(p.rec)}, nil))
		return fmt.Errorf("hand %s over: %w", h.Key(), err)
	}
	at := resp.Header.Revision
	if !resp.Succeeded {
		// A try whose answer was lost may have been applied: the key is then on the
		// candidate's lease, and the record with it, or accepted already.
		held, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		ours := len(held) == 1 && held[0].CreateRevision == h.Token()
		handed := ours && held[0].Lease == x.Lease
		switch {
		case handed && len(recs) == 0:
			p.settled.Store(true)
			h.HandedOver()
			return nil
		case handed && len(recs) == 1 && recs[0].CreateRevision == p.created && recs[0].Lease == x.Lease:
			at = recs[0].ModRevision
		case ours && clientv3.LeaseID(held[0].Lease) == h.Lease():
			p.withdraw(ctx)
			return fmt.Errorf("%w: the candidate %q gave its answer up before the handover (its Campaign ended)", ErrNoCandidate, x.Value)
		default:
			p.withdraw(ctx)
			gone := core.KeyGone(h.Key())
			h.Lose(gone)
			return gone
		}
	}
	p.settled.Store(true)
	return awaitAccept(ctx, q, h, p.own, x, &mvccpb.KeyValue{Key: []byte(p.rec), CreateRevision: p.created, ModRevision: at})
}

// awaitAccept waits for the candidate x to accept the handover of h (its record rec
// deleted) for up to core.HandoverWait, and takes the key back if it has not by then; see
// handOver. own is h's key as it was before the handover.
func awaitAccept(ctx context.Context, q *core.Queue, h *core.Hold, own, x, rec *mvccpb.KeyValue) error {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), core.HandoverWait)
	defer cancel()
	_, _ = core.AwaitGone(wctx, q.Client(), rec, nil, false)
	// Whatever the watch said, the Txn decides: take the key back unless the record went.
	bctx, bcancel := core.Detached(ctx)
	defer bcancel()
	resp, err := core.Retry(bctx, func(bctx context.Context) (*clientv3.TxnResponse, error) {
		return q.Client().Txn(clientv3.WithRequireLeader(bctx)).
			If(h.IsOwner(),
				clientv3.Compare(clientv3.LeaseValue(h.Key()), "=", x.Lease),
				clientv3.Compare(clientv3.CreateRevision(string(rec.Key)), "=", rec.CreateRevision)).
			Then(clientv3.OpPut(h.Key(), string(own.Value), clientv3.WithLease(h.Lease())),
				clientv3.OpDelete(string(rec.Key))).
			// Not keys only: etcd 3.7 answers those from its index, without the lease.
			Else(clientv3.OpGet(h.Key()), clientv3.OpGet(string(rec.Key), clientv3.WithKeysOnly())).
			Commit()
	})
	if err != nil {
		// The key is on the candidate's lease with the record beside it, or taken back: a
		// leader that cannot tell must not go on leading.
		giveUp(ctx, h, err)
		return fmt.Errorf("hand %s over: %w", h.Key(), err)
	}
	if resp.Succeeded {
		return fmt.Errorf("%w: the candidate %q answered, but did not take the leadership over within %v of the handover (its process died, or its Campaign ended)", ErrNoCandidate, x.Value, core.HandoverWait)
	}
	held, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(held) == 1 && held[0].CreateRevision == h.Token() && held[0].Lease == x.Lease && len(recs) == 0:
		h.HandedOver()
		return nil
	case len(held) == 1 && held[0].CreateRevision == h.Token() && clientv3.LeaseID(held[0].Lease) == h.Lease():
		// A try whose answer was lost took it back.
		return fmt.Errorf("%w: the candidate %q did not take the leadership over within %v of the handover", ErrNoCandidate, x.Value, core.HandoverWait)
	}
	h.Lose(core.KeyGone(h.Key()))
	if len(recs) > 0 { // the candidate dropped the key, unsure whether it had accepted
		_, _ = q.Client().Txn(clientv3.WithRequireLeader(bctx)).
			If(clientv3.Compare(clientv3.CreateRevision(string(rec.Key)), "=", rec.CreateRevision)).
			Then(clientv3.OpDelete(string(rec.Key))).Commit()
	}
	return fmt.Errorf("%w: the candidate's lease ended, or it gave the leadership up, as it took it over", ErrNoCandidate)
}

// giveUp ends h, a leadership whose handover etcd may or may not apply (err: no answer),
// as lost, and drops its key (Hold.Drop, with also), so that it is held by nobody for no
// longer than it takes: the next candidate then leads, and a handover applied late finds no
// key to hand.
func giveUp(ctx context.Context, h *core.Hold, err error, also ...clientv3.Op) {
	h.Lose(fmt.Errorf("%w: key %s: its handover got no answer: %w", ErrLost, h.Key(), err))
	h.Drop(ctx, also...)
}
