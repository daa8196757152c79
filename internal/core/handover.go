package core

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An election's leadership handed to a chosen candidate (election's Transfer), in two
// steps, so that a candidate that cannot take it over is found out before the leader stops
// its work: one whose process died (its key stays until its lease ends), one of an older
// version, one whose Campaign ended as it was chosen. The leader's side is package
// election's (election/handover.go); the record, its stages and the candidate's side, in
// its acquisition, are here.
//
// Propose: one Txn deletes the candidate's key and puts a record beside it
// (HandoverRecordKey) on the leader's lease, naming the leader's key and token, at the stage
// "proposed". The candidate hears of it by its own key's delete (a waiter of Spec.Handover
// watches it, also while it approaches), reads the record and answers by writing it again,
// "ready", on the same lease; then it follows the record. The leader waits up to
// HandoverWait for the answer and withdraws the record if none came: the transfer fails
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
// A candidate that does not accept within HandoverWait of the handover (it died after it
// answered) must not be left with a leadership nobody holds: the leader then takes its key
// back, and the transfer fails with ErrNoCandidate. A key of etcd's own Election (its layout
// has no slot) is never chosen: it would not notice its key's delete and would lead later
// without one.

// HandoverWait is how long a leader waits for the candidate it chose to answer its proposal,
// and, once it handed its key over, to accept it.
const HandoverWait = 5 * time.Second

// ErrNoCandidate: no candidate of the name has the value a transfer named, or the one it
// chose did not take the leadership over (see handover.go).
var ErrNoCandidate = errors.New("etcdsync: no such candidate")

// The stages of a handover's record: proposed by the leader, answered by the candidate, and
// "" once the key is handed (as older versions write it, in one step).
const (
	StageProposed = "proposed"
	StageReady    = "ready"
)

// HandoverRecordKey is where the record of a handover to key lies, key being under
// namePrefix: laid out as ReleaseRecordKey's, with "\x00handover/", outside the name's range.
func HandoverRecordKey(namePrefix, key string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00handover/" + strings.TrimPrefix(key, namePrefix)
}

// HandoverRecord is the record of a handover: the leader's key, at its create revision,
// and the stage the handover is at.
type HandoverRecord struct {
	Key   string `json:"key"`
	Token int64  `json:"token"`
	Stage string `json:"stage,omitempty"`
}

// ParseHandoverRecord reads the record kv of a handover of a key of namePrefix.
func ParseHandoverRecord(kv *mvccpb.KeyValue, namePrefix string) (HandoverRecord, bool) {
	var r HandoverRecord
	return r, json.Unmarshal(kv.Value, &r) == nil && strings.HasPrefix(r.Key, namePrefix)
}

// HandsOver reports whether key, of the queue's name, is of a candidate that takes a
// handover: etcdsync's layout "<lease hex>_<slot>", perhaps under a preference
// (PreferenceKind), not etcd's "<lease hex>".
func (q *Queue) HandsOver(key string) bool {
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

// Drop deletes h's key if it is still the one h created, on h's lease, and does also either
// way (see dropKey): for a hold that may have been handed on without an answer, so that its
// key is held by nobody for no longer than it takes. It does not end h. One Txn.
func (h *Hold) Drop(ctx context.Context, also ...clientv3.Op) {
	dropKey(ctx, h.cli, h.sess, h.key, h.rev, also...)
}

// dropKey deletes key, created at rev, if it is on sess's lease, and does also either way,
// in one Txn; if that gets no answer, sess is retired (its lease is revoked once its other
// holds end, taking the key with it).
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

// HandedOver ends h, whose key another lease now holds: done closes, its final error is nil,
// and its slot stays taken for good, as the key lives on under another holder (see detach).
func (h *Hold) HandedOver() {
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
	r, ok := ParseHandoverRecord(kv, q.prefix)
	switch {
	case !ok || kv.CreateRevision <= rev:
		return nil
	case r.Stage == StageProposed:
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
func (a *acquisition) answer(ctx context.Context, kv *mvccpb.KeyValue, r HandoverRecord) *mvccpb.KeyValue {
	cli, rec, created := a.cli(), string(kv.Key), kv.CreateRevision
	ready := r
	ready.Stage = StageReady
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
	case err != nil && Refused(err): // the leader's lease ended (its key with it), or no grant: no answer made
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
		now, ok := ParseHandoverRecord(kv, a.qs[0].prefix)
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
func (a *acquisition) accept(ctx context.Context, kv *mvccpb.KeyValue, r HandoverRecord) *Hold {
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
