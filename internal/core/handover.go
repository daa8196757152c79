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

// An election's leadership handed to a chosen candidate (election's Transfer).
//
// The leader's key stays where it is, the oldest of the name. One Txn puts it onto the
// candidate's lease with the candidate's value, deletes the candidate's own key, and leaves
// a record beside that key saying which key it was handed (HandoverRecordKey). Every other
// candidate keeps waiting for the leader's key, as before: etcd's concurrency.Election,
// `etcdctl elect`, etcdsync of an older version, and the candidates passed over, whose order
// is unchanged. The candidate hears of it by its own key's delete (a waiter of Spec.Handover
// watches it, also while it approaches), reads the record, and accepts by deleting it, in a
// Txn that compares that the leader's key is on its lease at the create revision the record
// names. From then on it holds that key: the fencing token passes with the key.
//
// A candidate of etcdsync's layout that does not accept within handoverWait (a process of an
// older version, which takes its key's delete for a loss; one whose Campaign ended as it was
// chosen) must not be left with a leadership nobody holds: the leader then takes its key
// back, and the transfer fails with ErrNoCandidate. A key of etcd's own Election (its layout
// has no slot) is never chosen: it would not notice its key's delete and would lead later
// without one.

// handoverWait is how long a leader waits for the candidate it handed its key to to accept.
const handoverWait = 5 * time.Second

// ErrNoCandidate: no candidate of the name has the value a transfer named, or the one it
// chose did not take the leadership over (see handover.go).
var ErrNoCandidate = errors.New("etcdsync: no such candidate")

// TransferRequestKey is where a request that the leader of the name transfer its
// leadership lies (election's RequestTransfer, `etcdsync transfer`): laid out as
// ReleaseRecordKey, outside the name's range.
func TransferRequestKey(namePrefix string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00transfer"
}

// HandoverRecordKey is where the record of a handover to key lies, key being under
// namePrefix: laid out as ReleaseRecordKey's, with "\x00handover/", outside the name's range.
func HandoverRecordKey(namePrefix, key string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00handover/" + strings.TrimPrefix(key, namePrefix)
}

// handoverRecord is the record of a handover: the key handed, at its create revision.
type handoverRecord struct {
	Key   string `json:"key"`
	Token int64  `json:"token"`
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
	resp, err := retry(ctx, func() (*clientv3.GetResponse, error) {
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

// HasCandidate reports, as ErrNoCandidate, that no candidate that takes a handover matches
// to; ErrLost if h's key is no longer its own. One Range.
func (q *Queue) HasCandidate(ctx context.Context, h *Hold, to Match) error {
	_, _, err := q.findCandidate(ctx, h, to)
	return err
}

// HandOver hands h, a leadership, to the candidate to matches (see above) and
// ends h once that candidate has accepted. Errors: ErrNoCandidate when there is none, or it
// did not accept within handoverWait (h is then held again); ErrLost when h's key is not its
// own; ctx's error. Cost: one Range, one Txn, a watch of the record until the candidate
// accepts, and one Txn more to take the key back.
func (q *Queue) HandOver(ctx context.Context, h *Hold, to Match) error {
	if !h.Live() {
		return errKeyGone(h.key)
	}
	for try := 0; ; try++ {
		own, x, err := q.findCandidate(ctx, h, to)
		if err != nil {
			return err
		}
		rec := HandoverRecordKey(q.prefix, string(x.Key))
		val, _ := json.Marshal(handoverRecord{Key: h.key, Token: h.rev})
		resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
			return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
				If(h.IsOwner(),
					clientv3.Compare(clientv3.LeaseValue(h.key), "=", h.sess.Lease()),
					clientv3.Compare(clientv3.CreateRevision(string(x.Key)), "=", x.CreateRevision)).
				Then(clientv3.OpPut(h.key, string(x.Value), clientv3.WithLease(clientv3.LeaseID(x.Lease))),
					clientv3.OpDelete(string(x.Key)),
					clientv3.OpPut(rec, string(val), clientv3.WithLease(clientv3.LeaseID(x.Lease)))).
				Else(clientv3.OpGet(h.key), clientv3.OpGet(rec)).
				Commit()
		})
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) && try < 2:
			continue // the candidate's lease ended: so did its key; choose again
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return fmt.Errorf("%w: the leases of the candidates %v kept ending", ErrNoCandidate, to)
		case err != nil && refused(err):
			return fmt.Errorf("hand %s over: %w", h.key, err) // not applied: the leader leads on
		case err != nil:
			// It may have been applied, or be applied later: this leadership is over.
			q.giveUp(ctx, h, err)
			return fmt.Errorf("hand %s over: %w", h.key, err)
		}
		at := resp.Header.Revision
		if !resp.Succeeded {
			// A try whose answer was lost may have been applied: then the key is on the
			// candidate's lease and the record is there, created by that Txn.
			held, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
			handed := len(held) == 1 && held[0].CreateRevision == h.rev && held[0].Lease == x.Lease
			if handed && len(recs) == 0 {
				h.handedOver() // and accepted already
				return nil
			}
			if !handed || len(recs) != 1 || string(recs[0].Value) != string(val) {
				if try < 2 {
					continue // the candidate left, or the key changed: read again
				}
				return fmt.Errorf("%w: the candidate %v kept changing", ErrNoCandidate, to)
			}
			at = recs[0].CreateRevision
		}
		return q.awaitAccept(ctx, h, own, x, &mvccpb.KeyValue{Key: []byte(rec), CreateRevision: at, ModRevision: at})
	}
}

// awaitAccept waits for the candidate x to accept the handover of h (its record rec
// deleted) for up to handoverWait, and takes the key back if it has not by then; see
// HandOver. own is h's key as it was before the handover.
func (q *Queue) awaitAccept(ctx context.Context, h *Hold, own, x, rec *mvccpb.KeyValue) error {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), handoverWait)
	defer cancel()
	awaitDelete(wctx, q.cli, rec, rec.ModRevision, false)
	// Whatever the watch said, the Txn decides: take the key back unless the record went.
	bctx, bcancel := Detached(ctx)
	defer bcancel()
	resp, err := retry(bctx, func() (*clientv3.TxnResponse, error) {
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
		return fmt.Errorf("%w: the candidate %q did not take the leadership over within %v (a process of an older etcdsync, or one that stopped campaigning)", ErrNoCandidate, x.Value, handoverWait)
	}
	held, recs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(held) == 1 && held[0].CreateRevision == h.rev && held[0].Lease == x.Lease && len(recs) == 0:
		h.handedOver()
		return nil
	case len(held) == 1 && held[0].CreateRevision == h.rev && clientv3.LeaseID(held[0].Lease) == h.sess.Lease():
		// A try whose answer was lost took it back.
		return fmt.Errorf("%w: the candidate %q did not take the leadership over within %v", ErrNoCandidate, x.Value, handoverWait)
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
// its lease revoked once its other holds end, taking the key with it.
func (q *Queue) giveUp(ctx context.Context, h *Hold, err error) {
	h.observe(fmt.Errorf("%w: key %s: its handover got no answer: %w", ErrLost, h.key, err))
	dropKey(ctx, q.cli, h.sess, h.key, h.rev)
}

// dropKey deletes key, created at rev, if it is on sess's lease (see giveUp), and does also
// either way. One Txn.
func dropKey(ctx context.Context, cli *clientv3.Client, sess *Session, key string, rev int64, also ...clientv3.Op) {
	dctx, cancel := Detached(ctx)
	defer cancel()
	_, err := retry(dctx, func() (*clientv3.TxnResponse, error) {
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

// takeHandover is how a waiter of spec.Handover whose own key, created at rev, was deleted
// learns whether that was a handover to it: it reads the record beside its key and accepts
// (see above). It returns the hold of the key handed over, or nil when it was not, or the
// handover was taken back. One Range and one Txn.
func (a *acquisition) takeHandover(ctx context.Context, rev int64) *Hold {
	q, key := a.qs[0], a.slots[0].key()
	rec := HandoverRecordKey(q.prefix, key)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordWait)
	defer cancel()
	resp, err := retry(ctx, func() (*clientv3.GetResponse, error) {
		return q.cli.Get(clientv3.WithRequireLeader(ctx), rec)
	})
	if err != nil || len(resp.Kvs) == 0 {
		return nil
	}
	var r handoverRecord
	if json.Unmarshal(resp.Kvs[0].Value, &r) != nil || !strings.HasPrefix(r.Key, q.prefix) || resp.Kvs[0].CreateRevision <= rev {
		return nil
	}
	tresp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(clientv3.Compare(clientv3.CreateRevision(r.Key), "=", r.Token),
				clientv3.Compare(clientv3.LeaseValue(r.Key), "=", a.sess.Lease()),
				clientv3.Compare(clientv3.CreateRevision(rec), "=", resp.Kvs[0].CreateRevision)).
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

// A TransferRequest asks the leader of a name to move its leadership: to the candidate
// whose value is To, or, with To nil, to step down. It lies at TransferRequestKey, on the
// lease of the one who asks, and the leader deletes it once it has done what it asks, or
// found that it cannot (see election's RequestTransfer).
type TransferRequest struct {
	To *string `json:"to,omitempty"`
	// Key and Token are of the leadership it asks: a later one (another leader, or the key
	// handed over) answers it without doing what it asks.
	Key   string `json:"key"`
	Token int64  `json:"token"`
	By    string `json:"by"` // the process that asks: OwnerValue's host and pid
}

// ParseTransferRequest reads the request kv, a key at TransferRequestKey.
func ParseTransferRequest(kv *mvccpb.KeyValue) (TransferRequest, bool) {
	var r TransferRequest
	return r, json.Unmarshal(kv.Value, &r) == nil
}

// ErrTransferAsked: a request to transfer the leadership of the name is there already.
var ErrTransferAsked = errors.New("a transfer of the leadership is asked already")

// AskTransfer writes the request r of the name's leader, on the lease of the shared
// session, unless one is there (ErrTransferAsked), and waits until it is gone: the leader
// answered it, or the lease went. When ctx ends first, it deletes the request (fenced on
// its create revision) before returning ctx's error. One Txn, a watch, and one Txn more
// to take it back.
func (q *Queue) AskTransfer(ctx context.Context, r TransferRequest) error {
	key := TransferRequestKey(q.prefix)
	val, _ := json.Marshal(r)
	created, err := withSession(ctx, q.sessions, func(sess *Session) (int64, error) {
		resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
			return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, string(val), clientv3.WithLease(sess.Lease()))).
				Else(clientv3.OpGet(key)).
				Commit()
		})
		switch {
		case err != nil:
			return 0, err
		case resp.Succeeded:
			return resp.Header.Revision, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 1 && clientv3.LeaseID(kvs[0].Lease) == sess.Lease() && string(kvs[0].Value) == string(val) {
			return kvs[0].CreateRevision, nil // a try whose answer was lost wrote it
		}
		return 0, ErrTransferAsked
	})
	if err != nil {
		return fmt.Errorf("ask for a transfer: %w", err)
	}
	kv := &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created}
	for ctx.Err() == nil && !awaitDelete(clientv3.WithRequireLeader(ctx), q.cli, kv, created, false) {
		// The watch broke (compaction, a leader change of etcd): read whether it is gone.
		resp, err := retry(ctx, func() (*clientv3.GetResponse, error) {
			return q.cli.Get(clientv3.WithRequireLeader(ctx), key, clientv3.WithKeysOnly())
		})
		if err == nil && (len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != created) {
			return nil
		}
		if err := Pause(ctx, 100*time.Millisecond); err != nil {
			break
		}
	}
	if ctx.Err() == nil {
		return nil
	}
	dctx, cancel := Detached(ctx)
	defer cancel()
	_, _ = retry(dctx, func() (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(dctx)).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", created)).
			Then(clientv3.OpDelete(key)).
			Commit()
	})
	return ctx.Err()
}

// AnswerTransfer deletes the request kv, which the leader has answered, if it is still
// the one it read (a compare on its create revision). One Txn, best effort.
func (q *Queue) AnswerTransfer(ctx context.Context, kv *mvccpb.KeyValue) {
	if kv == nil {
		return
	}
	dctx, cancel := Detached(ctx)
	defer cancel()
	_, _ = retry(dctx, func() (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(dctx)).
			If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).
			Commit()
	})
}
