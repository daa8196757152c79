package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
