package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// What asks a leadership to move: a request that its leader transfer it (or step down), and
// what the leader follows (FollowAsks); package election proposes the handover it asks for
// (see handover.go).

// TransferRequestKey is where a request that the leader of the name transfer its
// leadership lies (election's RequestTransfer, `etcdsync transfer`): laid out as
// ReleaseRecordKey, outside the name's range.
func TransferRequestKey(namePrefix string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00transfer"
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
		resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
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
	if gone, err := AwaitGone(ctx, q.cli, kv, nil, false); gone {
		return nil
	} else if ctx.Err() == nil {
		return fmt.Errorf("await the answer to a transfer: %w", err)
	}

	dctx, cancel := Detached(ctx)
	defer cancel()
	_, _ = Retry(dctx, func(dctx context.Context) (*clientv3.TxnResponse, error) {
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
	_, _ = Retry(dctx, func(dctx context.Context) (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(dctx)).
			If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).
			Commit()
	})
}

// FollowAsks follows, for the leadership h, what asks it to move, until something has (or
// ctx ends, or nothing can ask it): a request at TransferRequestKey, which request judges
// (true: it asks, and FollowAsks returns), and an ask of h's key (admin.Ask), which it
// judges as a request to step down (its kv the ask's record, so that the answer deletes
// it); and the candidates with a preference above pref,
// of which, once one has waited settle and the leadership has lasted as long, the most
// preferred (the oldest of them on a tie) is offered to preferred, which reports whether it
// asked, or whether that candidate is gone. It reads the request and the candidates, then
// follows both (Follow's watch-then-read, after any gap a read again). A request out of this
// client's reach (a grant of the name's keys alone) is not followed; preferences still are.
// Cost: a Range of the request's key, one Txn, three watches while it lasts, and a read again
// after a gap or when a candidate has waited long enough.
func (q *Queue) FollowAsks(ctx context.Context, h *Hold, pref int, settle time.Duration,
	request func(*mvccpb.KeyValue) bool, preferred func(key string) (asked, gone bool)) {
	type candidate struct {
		n    int
		seen time.Time // when it was first seen (or the following started)
		rev  int64     // its key's create revision
	}
	reqKey, prefRange := TransferRequestKey(q.prefix), PreferenceRange(q.prefix)
	// An ask of the leadership's own key (admin.Ask) is a request to step down: request
	// judges it as one, and the answer deletes its record.
	askKey := AskRecordKey(q.prefix, h.Key())
	stepDown := func(kv *mvccpb.KeyValue) bool {
		rec, ok := recordOf([]*mvccpb.KeyValue{kv}, h.Token())
		if !ok {
			return false
		}
		val, _ := json.Marshal(TransferRequest{Key: h.Key(), Token: h.Token(), By: rec.By})
		return request(&mvccpb.KeyValue{Key: kv.Key, CreateRevision: kv.CreateRevision, Value: val})
	}
	start := time.Now()
	cands := map[string]*candidate{}
	// wake closes when a candidate may have waited long enough (or the leadership lasted a
	// settle time): the following stops, and the best candidate is offered. Each new
	// candidate arms it, for its settle time, unless it is armed for sooner.
	var wake chan struct{}
	var timer *time.Timer
	var at time.Time
	arm := func(d time.Duration) {
		when := time.Now().Add(d)
		if timer != nil && !when.Before(at) || timer != nil && !timer.Stop() {
			return // armed for sooner, or fired already
		}
		w := wake
		at, timer = when, time.AfterFunc(d, func() { close(w) })
	}
	note := func(kv *mvccpb.KeyValue, now time.Time) {
		key := string(kv.Key)
		n, _, ok := CutPreference(key[len(q.prefix):])
		if !ok || n <= pref || key == h.Key() {
			return
		}
		if c := cands[key]; c != nil && c.rev == kv.CreateRevision {
			return
		}
		cands[key] = &candidate{n: n, seen: now, rev: kv.CreateRevision}
		arm(max(settle, start.Add(settle).Sub(now)))
	}
	// A request out of reach (a grant of the name's keys alone) is no longer followed: a
	// watch refused for it would be placed again and again, and the read never made.
	_, err := q.cli.Get(clientv3.WithRequireLeader(ctx), reqKey, clientv3.WithCountOnly())
	requests := !errors.Is(err, rpctypes.ErrPermissionDenied)
	var b Backoff
	for ctx.Err() == nil {
		// The best candidate that has waited long enough, if the leadership has lasted as
		// long; and when the next one will have.
		now, next, choice := time.Now(), time.Duration(0), ""
		if wait := settle - now.Sub(start); wait > 0 {
			next = wait
		} else {
			var best *candidate
			for key, c := range cands {
				switch wait := settle - now.Sub(c.seen); {
				case wait > 0:
					if next == 0 || wait < next {
						next = wait
					}
				case best == nil || c.n > best.n || c.n == best.n && c.rev < best.rev:
					best, choice = c, key
				}
			}
		}
		if choice != "" {
			asked, gone := preferred(choice)
			switch {
			case asked:
				return
			case gone:
				delete(cands, choice) // its delete is on its way
			default: // lost, or etcd refused the read: read again after a pause
				if !h.Live() || b.wait(ctx) != nil {
					return
				}
			}
			continue
		}
		wake, timer = make(chan struct{}), nil
		if next > 0 {
			arm(next)
		}
		ws := []watched{{prefRange, []clientv3.OpOption{clientv3.WithPrefix()}}}
		if requests {
			ws = append(ws, watched{key: reqKey}, watched{key: askKey})
		}
		check := func() (int64, Verdict, error) {
			reads := []clientv3.Op{clientv3.OpGet(prefRange, clientv3.WithPrefix())}
			if requests {
				reads = append(reads, clientv3.OpGet(reqKey), clientv3.OpGet(askKey))
			}
			resp, err := ReadState(ctx, q.cli, reads...)
			if err != nil {
				return 0, StillWaiting, err
			}
			now, present := time.Now(), map[string]bool{}
			for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
				present[string(kv.Key)] = true
				note(kv, now)
			}
			for key := range cands {
				if !present[key] {
					delete(cands, key)
				}
			}
			if requests {
				if reqs := resp.Responses[1].GetResponseRange().Kvs; len(reqs) == 1 && request(reqs[0]) {
					return resp.Header.Revision, WaitOver, nil
				}
				if asks := resp.Responses[2].GetResponseRange().Kvs; len(asks) == 1 && stepDown(asks[0]) {
					return resp.Header.Revision, WaitOver, nil
				}
			}
			return resp.Header.Revision, StillWaiting, nil
		}
		each := func(ev *clientv3.Event) (Verdict, error) {
			switch key := string(ev.Kv.Key); {
			case key == reqKey:
				if ev.Type == mvccpb.PUT && request(ev.Kv) {
					return WaitOver, nil
				}
			case key == askKey:
				if ev.Type == mvccpb.PUT && stepDown(ev.Kv) {
					return WaitOver, nil
				}
			case ev.Type == mvccpb.DELETE:
				delete(cands, key)
			default:
				note(ev.Kv, time.Now())
			}
			return StillWaiting, nil
		}
		asked, err := followAll(ctx, q.cli, ws, wake, check, each)
		if timer != nil {
			timer.Stop()
		}
		switch {
		case asked:
			return
		case errors.Is(err, rpctypes.ErrPermissionDenied) && requests:
			// A grant of the name's keys alone: the request beside the name is out of
			// reach, so no request can ask this leader anything; preferences still can.
			requests = false
		case err != nil && !transient(err):
			return // nothing can ask this leader to move (or ctx ended, or the client closed)
		case err != nil:
			if b.wait(ctx) != nil {
				return
			}
		}
	}
}
