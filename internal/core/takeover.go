package core

import (
	"context"
	"encoding/json"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	resp, err := retry(rctx, func(rctx context.Context) (*clientv3.GetResponse, error) {
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
	resp, err := retry(tctx, func(tctx context.Context) (*clientv3.TxnResponse, error) {
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
	judge := func(kv *mvccpb.KeyValue) verdict {
		now, ok := parseRecord(kv, a.qs[0].prefix)
		switch {
		case kv.CreateRevision != created || !ok || now.Key != r.Key || now.Token != r.Token:
			return waitOver // another record: this one was withdrawn
		case now.Stage == "":
			handed = kv
			return waitOver
		}
		return stillWaiting
	}
	over, err := follow(ctx, cli, rec, a.sess.Done(),
		func() (int64, verdict, error) {
			resp, err := readState(ctx, cli, clientv3.OpGet(rec))
			if err != nil {
				return 0, stillWaiting, err
			}
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
				return resp.Header.Revision, judge(kvs[0]), nil
			}
			return resp.Header.Revision, waitOver, nil // withdrawn
		},
		func(ev *clientv3.Event) (verdict, error) {
			if ev.Type == mvccpb.DELETE {
				return waitOver, nil
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
	tresp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
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
