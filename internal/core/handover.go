package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An election's leadership handed to a chosen candidate (election's Transfer), in two
// steps, so that a candidate that cannot take it over is found out before the leader stops
// its work: one whose process died (its key stays until its lease ends), one of an older
// version, one whose Campaign ended as it was chosen.
//
// Propose: one Txn deletes the candidate's key and puts a record beside it
// (HandoverRecordKey) on the leader's lease, naming the leader's key and token, at the stage
// "proposed". The candidate hears of it by its own key's delete (a waiter of Spec.Handover
// watches it, also while it approaches), reads the record and answers by writing it again,
// "ready", on the same lease; then it follows the record. The leader waits up to
// handoverWait for the answer and withdraws the record if none came: the transfer fails
// with ErrNoCandidate, and nothing changed but the candidate's place (its key went). An
// older version's candidate takes the record for a handover not made, and leaves it.
//
// Hand over: once its work has stopped, the leader puts its key, which stays where it is,
// the oldest of the name, onto the candidate's lease with the candidate's value, and the
// record with it, without a stage, in one Txn that compares that the answer is still there.
// The candidate accepts by deleting the record, in a Txn that compares that the leader's
// key is on its lease at the create revision the record names. From then on it holds that
// key: the fencing token passes with the key. Every other candidate keeps waiting for the
// leader's key, as before: etcd's concurrency.Election, `etcdctl elect`, etcdsync of an
// older version, and the candidates passed over, whose order is unchanged. A record
// without a stage is also what an older version's leader writes, in one step: it is
// accepted as such.
//
// Until the handover the record lies on the leader's lease, so a leader that dies takes it
// with it and ends the candidate's wait; a leader that does not hand over (its leadership
// ended first, or the handover was refused) withdraws it, deleting it while it is on its
// lease. A candidate that stops waiting (its Campaign's ctx, its session) deletes it, and a
// handover then finds no answer: the leader keeps its key and leads on.
//
// A candidate that does not accept within handoverWait of the handover (it died after it
// answered) must not be left with a leadership nobody holds: the leader then takes its key
// back, and the transfer fails with ErrNoCandidate. A key of etcd's own Election (its layout
// has no slot) is never chosen: it would not notice its key's delete and would lead later
// without one.

// handoverWait is how long a leader waits for the candidate it chose to answer its proposal,
// and, once it handed its key over, to accept it.
const handoverWait = 5 * time.Second

// ErrNoCandidate: no candidate of the name has the value a transfer named, or the one it
// chose did not take the leadership over (see handover.go).
var ErrNoCandidate = errors.New("etcdsync: no such candidate")

// The stages of a handover's record: proposed by the leader, answered by the candidate, and
// "" once the key is handed (as older versions write it, in one step).
const (
	stageProposed = "proposed"
	stageReady    = "ready"
)

// HandoverRecordKey is where the record of a handover to key lies, key being under
// namePrefix: laid out as ReleaseRecordKey's, with "\x00handover/", outside the name's range.
func HandoverRecordKey(namePrefix, key string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00handover/" + strings.TrimPrefix(key, namePrefix)
}

// handoverRecord is the record of a handover: the leader's key, at its create revision,
// and the stage the handover is at.
type handoverRecord struct {
	Key   string `json:"key"`
	Token int64  `json:"token"`
	Stage string `json:"stage,omitempty"`
}

// parseRecord reads the record kv of a handover of a key of namePrefix.
func parseRecord(kv *mvccpb.KeyValue, namePrefix string) (handoverRecord, bool) {
	var r handoverRecord
	return r, json.Unmarshal(kv.Value, &r) == nil && strings.HasPrefix(r.Key, namePrefix)
}

// handsOver reports whether key, of the queue's name, is of a candidate that takes a
// handover: etcdsync's layout "<lease hex>_<slot>", perhaps under a preference
// (PreferenceKind), not etcd's "<lease hex>".
func (q *Queue) handsOver(key string) bool {
	rest, ok := strings.CutPrefix(key, q.prefix)
	if _, r, ok := CutPreference(rest); ok {
		rest = r
	}
	return ok && strings.Contains(rest, "_") && !strings.Contains(rest, "/")
}

// PreferenceKind is the kind (Spec.Kind) of an election's candidate with preference n > 0:
// its key is "<name>/p<n>/<lease hex>_<slot>", so that a leader learns who is preferred
// from the keys themselves, watching "<name>/p" (no lease in hex starts with 'p').
func PreferenceKind(n int) string { return "p" + strconv.Itoa(n) + "/" }

// PreferenceRange is the key prefix of the name's candidates with a preference.
func PreferenceRange(namePrefix string) string { return namePrefix + "p" }

// CutPreference splits rest, what follows a name's prefix in a key, into a candidate's
// preference and what follows it; ok is false if rest has none.
func CutPreference(rest string) (n int, after string, ok bool) {
	p, after, found := strings.Cut(rest, "/")
	if !found || len(p) < 2 || p[0] != 'p' {
		return 0, rest, false
	}
	n, err := strconv.Atoi(p[1:])
	if err != nil || n <= 0 || p[1] == '0' || p[1] == '+' {
		return 0, rest, false
	}
	return n, after, true
}

// A Match picks the candidate a transfer goes to: the one with key Key if Key is set, else
// the oldest whose value is Value.
type Match struct {
	Key, Value string
}

func (m Match) String() string {
	if m.Key != "" {
		return fmt.Sprintf("with key %q", m.Key)
	}
	return fmt.Sprintf("%q", m.Value)
}

func (m Match) matches(kv *mvccpb.KeyValue) bool {
	if m.Key != "" {
		return string(kv.Key) == m.Key
	}
	return string(kv.Value) == m.Value
}

// findCandidate reads the name, linearizably: own is h's key if it is still h's and on its
// lease, and x the oldest other key that to matches and that takes a handover. ErrLost if
// h's key is not; ErrNoCandidate, saying what there is, if no key is x. One Range.
func (q *Queue) findCandidate(ctx context.Context, h *Hold, to Match) (own, x *mvccpb.KeyValue, err error) {
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return q.cli.Get(clientv3.WithRequireLeader(ctx), q.prefix, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the candidates: %w", err)
	}
	foreign := false
	for _, kv := range resp.Kvs {
		switch {
		case string(kv.Key) == h.key:
			own = kv
		case x != nil || !to.matches(kv):
		case q.handsOver(string(kv.Key)):
			x = kv
		default:
			foreign = true
		}
	}
	switch {
	case own == nil || own.CreateRevision != h.rev || clientv3.LeaseID(own.Lease) != h.sess.Lease():
		h.observe(errKeyGone(h.key))
		return nil, nil, errKeyGone(h.key)
	case x == nil && foreign:
		return nil, nil, fmt.Errorf("%w: the candidate %v is not etcdsync's (etcd's own Election cannot take a handover)", ErrNoCandidate, to)
	case x == nil:
		return nil, nil, fmt.Errorf("%w: no candidate %v", ErrNoCandidate, to)
	}
	return own, x, nil
}

// HandOver hands p's leadership to its candidate, which answered, and ends the leadership
// once the candidate has accepted. Errors: ErrNoCandidate when the candidate gave its
// answer up since, or did not accept within handoverWait (the leader then has its key
// back); ErrLost when the leader's key is not its own; etcd's: a refusal leaves the leader
// leading, an answer that did not come ends its leadership (the handover may be applied
// later). Cost: one Txn, a watch of the record until the candidate accepts, and one Txn
// more to take the key back if it does not.
func (q *Queue) HandOver(ctx context.Context, p *Proposal) error {
	h, x := p.h, p.x
	if !h.Live() {
		p.Withdraw(ctx)
		return errKeyGone(h.key)
	}
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(h.IsOwner(),
				clientv3.Compare(clientv3.LeaseValue(h.key), "=", h.sess.Lease()),
				clientv3.Compare(clientv3.ModRevision(p.rec), "=", p.answer)).
			Then(clientv3.OpPut(h.key, string(x.Value), clientv3.WithLease(clientv3.LeaseID(x.Lease))),
				clientv3.OpPut(p.rec, p.record(""), clientv3.WithLease(clientv3.LeaseID(x.Lease)))).
			Else(clientv3.OpGet(h.key), clientv3.OpGet(p.rec)).
			Commit()
	})
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		p.Withdraw(ctx)
		return fmt.Errorf("%w: the lease of the candidate %q ended after it answered", ErrNoCandidate, x.Value)
	case err != nil && refused(err):
		p.Withdraw(ctx)
		return fmt.Errorf("hand %s over: %w", h.key, err) // not applied: the leader leads on
	case err != nil:
		// It may have been applied, or be applied later: this leadership is over.
		p.settled.Store(true)
		q.giveUp(ctx, h, err, clientv3.OpTxn([]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(p.rec), "=", p.created),
			clientv3.Compare(clientv3.LeaseValue(p.rec), "=", h.sess.Lease())},
			[]clientv3.Op{clientv3.OpDelete(p.rec)}, nil))
		return fmt.Errorf("hand %s over: %w", h.key, err)
	}
	at := resp.Header.Revision
	if !resp.Succeeded {
		// A try whose answer was lost may have been applied: the key is then on the
		// candidate's lease, and the record with it, or accepted already.
		held, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		ours := len(held) == 1 && held[0].CreateRevision == h.rev
		handed := ours && held[0].Lease == x.Lease
		switch {
		case handed && len(recs) == 0:
			p.settled.Store(true)
			h.handedOver()
			return nil
		case handed && len(recs) == 1 && recs[0].CreateRevision == p.created && recs[0].Lease == x.Lease:
			at = recs[0].ModRevision
		case ours && clientv3.LeaseID(held[0].Lease) == h.sess.Lease():
			p.Withdraw(ctx)
			return fmt.Errorf("%w: the candidate %q gave its answer up before the handover (its Campaign ended)", ErrNoCandidate, x.Value)
		default:
			p.Withdraw(ctx)
			h.observe(errKeyGone(h.key))
			return errKeyGone(h.key)
		}
	}
	p.settled.Store(true)
	return q.awaitAccept(ctx, h, p.own, x, &mvccpb.KeyValue{Key: []byte(p.rec), CreateRevision: p.created, ModRevision: at})
}

// awaitAccept waits for the candidate x to accept the handover of h (its record rec
// deleted) for up to handoverWait, and takes the key back if it has not by then; see
// HandOver. own is h's key as it was before the handover.
func (q *Queue) awaitAccept(ctx context.Context, h *Hold, own, x, rec *mvccpb.KeyValue) error {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), handoverWait)
	defer cancel()
	_, _ = AwaitGone(wctx, q.cli, rec, nil, false)
	// Whatever the watch said, the Txn decides: take the key back unless the record went.
	bctx, bcancel := Detached(ctx)
	defer bcancel()
	resp, err := Retry(bctx, func(bctx context.Context) (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(bctx)).
			If(h.IsOwner(),
				clientv3.Compare(clientv3.LeaseValue(h.key), "=", x.Lease),
				clientv3.Compare(clientv3.CreateRevision(string(rec.Key)), "=", rec.CreateRevision)).
			Then(clientv3.OpPut(h.key, string(own.Value), clientv3.WithLease(h.sess.Lease())),
				clientv3.OpDelete(string(rec.Key))).
			// Not keys only: etcd 3.7 answers those from its index, without the lease.
			Else(clientv3.OpGet(h.key), clientv3.OpGet(string(rec.Key), clientv3.WithKeysOnly())).
			Commit()
	})
	if err != nil {
		// The key is on the candidate's lease with the record beside it, or taken back: a
		// leader that cannot tell must not go on leading.
		q.giveUp(ctx, h, err)
		return fmt.Errorf("hand %s over: %w", h.key, err)
	}
	if resp.Succeeded {
		return fmt.Errorf("%w: the candidate %q answered, but did not take the leadership over within %v of the handover (its process died, or its Campaign ended)", ErrNoCandidate, x.Value, handoverWait)
	}
	held, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(held) == 1 && held[0].CreateRevision == h.rev && held[0].Lease == x.Lease && len(recs) == 0:
		h.handedOver()
		return nil
	case len(held) == 1 && held[0].CreateRevision == h.rev && clientv3.LeaseID(held[0].Lease) == h.sess.Lease():
		// A try whose answer was lost took it back.
		return fmt.Errorf("%w: the candidate %q did not take the leadership over within %v of the handover", ErrNoCandidate, x.Value, handoverWait)
	}
	h.observe(errKeyGone(h.key))
	if len(recs) > 0 { // the candidate dropped the key, unsure whether it had accepted
		_, _ = q.cli.Txn(clientv3.WithRequireLeader(bctx)).
			If(clientv3.Compare(clientv3.CreateRevision(string(rec.Key)), "=", rec.CreateRevision)).
			Then(clientv3.OpDelete(string(rec.Key))).Commit()
	}
	return fmt.Errorf("%w: the candidate's lease ended, or it gave the leadership up, as it took it over", ErrNoCandidate)
}

// giveUp ends h, a leadership whose handover etcd may or may not apply (err: no answer),
// as lost, and deletes its key if it is still on h's lease, so that it is held by nobody
// for no longer than it takes: the next candidate then leads, and a handover applied late
// finds no key to hand. If that delete gets no answer either, the session is retired, and
// its lease revoked once its other holds end, taking the key with it. The same Txn does also.
func (q *Queue) giveUp(ctx context.Context, h *Hold, err error, also ...clientv3.Op) {
	h.observe(fmt.Errorf("%w: key %s: its handover got no answer: %w", ErrLost, h.key, err))
	dropKey(ctx, q.cli, h.sess, h.key, h.rev, also...)
}

// dropKey deletes key, created at rev, if it is on sess's lease (see giveUp), and does also
// either way. One Txn.
func dropKey(ctx context.Context, cli *clientv3.Client, sess *Session, key string, rev int64, also ...clientv3.Op) {
	dctx, cancel := Detached(ctx)
	defer cancel()
	_, err := Retry(dctx, func(dctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(dctx)).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev),
				clientv3.Compare(clientv3.LeaseValue(key), "=", sess.Lease())).
			Then(append([]clientv3.Op{clientv3.OpDelete(key)}, also...)...).
			Else(also...).
			Commit()
	})
	if err != nil {
		sess.retire()
	}
}

// handedOver ends h, whose key another lease now holds: done closes, its final error is nil,
// and its slot stays taken for good, as the key lives on under another holder (see detach).
func (h *Hold) handedOver() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != held {
		return
	}
	h.endWith(over, nil, false)
	h.slot.detach()
}

// The candidate's side of a handover (see handover.go): a waiter of Spec.Handover whose own
// key was deleted reads the record beside it; it answers a proposal, follows the record
// until the leader hands its key over, and accepts.

// takeHandover is how a waiter of spec.Handover whose own key, created at rev, was deleted
// learns whether that was a handover to it, and takes it over. It returns the hold of the
// key handed over; nil when there was none (the key was deleted otherwise), or the leader
// withdrew it or took it back, or ctx or the session ended first: the waiter's key is gone
// either way. One Range; for a proposal a Txn and a follow of the record until the leader
// hands over; then one Txn.
func (a *acquisition) takeHandover(ctx context.Context, rev int64) *Hold {
	q, key := a.qs[0], a.slots[0].key()
	rec := HandoverRecordKey(q.prefix, key)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWait)
	resp, err := Retry(rctx, func(rctx context.Context) (*clientv3.GetResponse, error) {
		return q.cli.Get(clientv3.WithRequireLeader(rctx), rec)
	})
	cancel()
	if err != nil || len(resp.Kvs) == 0 {
		return nil
	}
	kv := resp.Kvs[0]
	r, ok := parseRecord(kv, q.prefix)
	switch {
	case !ok || kv.CreateRevision <= rev:
		return nil
	case r.Stage == stageProposed:
		if kv = a.answer(ctx, kv, r); kv == nil {
			return nil
		}
	case r.Stage != "":
		return nil
	}
	return a.accept(ctx, kv, r)
}

// answer tells the leader whose proposal r is (its record kv) that this waiter takes the
// leadership over, and follows the record until the leader hands its key over: it returns
// the record then. It returns nil when the leader withdrew (the record went, or its lease
// did), or ctx or the session ended, or etcd refused: the record is then deleted, so that
// the leader leads on, and a key handed meanwhile is deleted with it.
func (a *acquisition) answer(ctx context.Context, kv *mvccpb.KeyValue, r handoverRecord) *mvccpb.KeyValue {
	cli, rec, created := a.cli(), string(kv.Key), kv.CreateRevision
	ready := r
	ready.Stage = stageReady
	val, _ := json.Marshal(ready)
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWait)
	resp, err := Retry(tctx, func(tctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(tctx)).
			If(clientv3.Compare(clientv3.ModRevision(rec), "=", kv.ModRevision)).
			Then(clientv3.OpPut(rec, string(val), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))).
			Else(clientv3.OpGet(rec)).
			Commit()
	})
	cancel()
	switch {
	case err != nil && refused(err): // the leader's lease ended (its key with it), or no grant: no answer made
		return nil
	case err != nil:
		dropKey(ctx, cli, a.sess, r.Key, r.Token, fencedDelete(rec, created)) // it may have answered
		return nil
	case !resp.Succeeded:
		// Withdrawn; or answered by a try whose answer was lost.
		if recs := resp.Responses[0].GetResponseRange().Kvs; len(recs) != 1 || recs[0].CreateRevision != created || string(recs[0].Value) != string(val) {
			return nil
		}
	}
	var handed *mvccpb.KeyValue
	judge := func(kv *mvccpb.KeyValue) Verdict {
		now, ok := parseRecord(kv, a.qs[0].prefix)
		switch {
		case kv.CreateRevision != created || !ok || now.Key != r.Key || now.Token != r.Token:
			return WaitOver // another record: this one was withdrawn
		case now.Stage == "":
			handed = kv
			return WaitOver
		}
		return StillWaiting
	}
	over, err := Follow(ctx, cli, rec, a.sess.Done(),
		func() (int64, Verdict, error) {
			resp, err := ReadState(ctx, cli, clientv3.OpGet(rec))
			if err != nil {
				return 0, StillWaiting, err
			}
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
				return resp.Header.Revision, judge(kvs[0]), nil
			}
			return resp.Header.Revision, WaitOver, nil // withdrawn
		},
		func(ev *clientv3.Event) (Verdict, error) {
			if ev.Type == mvccpb.DELETE {
				return WaitOver, nil
			}
			return judge(ev.Kv), nil
		})
	if over && err == nil {
		return handed
	}
	// The wait was given up: no handover is to find an answer, nor a key handed this lease.
	dropKey(ctx, cli, a.sess, r.Key, r.Token, fencedDelete(rec, created))
	return nil
}

// accept takes over the key that the record kv (of r) says was handed to this waiter: it
// deletes the record, in a Txn that compares that the key is on the waiter's lease at the
// record's token. nil when it is not (taken back, or gone), or etcd did not answer (the key
// is then deleted if it is on this lease). One Txn.
func (a *acquisition) accept(ctx context.Context, kv *mvccpb.KeyValue, r handoverRecord) *Hold {
	q, rec := a.qs[0], string(kv.Key)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWait)
	defer cancel()
	tresp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(clientv3.Compare(clientv3.CreateRevision(r.Key), "=", r.Token),
				clientv3.Compare(clientv3.LeaseValue(r.Key), "=", a.sess.Lease()),
				clientv3.Compare(clientv3.CreateRevision(rec), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(rec)).
			Else(clientv3.OpGet(r.Key), clientv3.OpGet(rec, clientv3.WithKeysOnly())). // with the lease
			Commit()
	})
	if err != nil {
		// Whether it accepted is unknown: the key may be on this session's lease with nobody
		// holding it. It is deleted if it is (the next candidate then leads, and the
		// leader's take-back finds nothing to take), or its lease revoked later.
		dropKey(ctx, q.cli, a.sess, r.Key, r.Token, clientv3.OpDelete(rec))
		return nil
	}
	if !tresp.Succeeded {
		// Taken back, or gone; or accepted by a try whose answer was lost: the key is then
		// on this lease at its revision, and the record gone (a take-back moves the key).
		held, recs := tresp.Responses[0].GetResponseRange().Kvs, tresp.Responses[1].GetResponseRange().Kvs
		if len(held) != 1 || held[0].CreateRevision != r.Token || clientv3.LeaseID(held[0].Lease) != a.sess.Lease() || len(recs) != 0 {
			return nil
		}
	}
	sl := &slot{k: r.Key, name: len(q.prefix), stem: -1, sess: a.sess}
	a.sess.claim()
	return newHold(q.cli, a.sess, sl, r.Token)
}
