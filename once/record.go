package once

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// A job's record lies at core.OnceRecordKey, beside its name's keys, and is written only by
// the job's hold.

// readRecord reads key, linearizably: its value and mod revision, 0 when it is absent. One
// Range, retried through leader changes and tries that got no answer.
func readRecord(ctx context.Context, cli *clientv3.Client, key string) (value string, modRev int64, err error) {
	resp, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return cli.Get(clientv3.WithRequireLeader(ctx), key)
	})
	if err != nil {
		return "", 0, fmt.Errorf("read %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, nil
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision, nil
}

// putRecordIf writes value at key while the hold whose key is holdKey, created at token,
// still holds and key's mod revision is still modRev (0: absent), so that a record moves
// only from what its writer read, and only while its writer holds. One Txn, retried through
// leader changes and tries that got no answer: a later try that finds value at key says it
// was written, so value must be one no other write makes (it names the token). ErrLost,
// wrapped, when the hold's key is gone; false with no error when the record moved.
func putRecordIf(ctx context.Context, cli *clientv3.Client, holdKey string, token int64, key string, modRev int64, value string) (written bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err // before any I/O: a try outlives ctx (see core.CommitWrite), and would write
	}
	res, err := core.CommitWrite(ctx, cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(clientv3.Compare(clientv3.CreateRevision(holdKey), "=", token),
			clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, value)).
			Else(clientv3.OpGet(key), clientv3.OpGet(holdKey, clientv3.WithKeysOnly()))
	})
	switch {
	case err != nil:
		return false, fmt.Errorf("record %q: %w", key, err)
	case res.Resp.Succeeded:
		return true, nil
	}
	rec := res.Resp.Responses[0].GetResponseRange().Kvs
	if res.Unknown && len(rec) == 1 && string(rec[0].Value) == value {
		return true, nil // an earlier try wrote it
	}
	if hold := res.Resp.Responses[1].GetResponseRange().Kvs; len(hold) == 0 || hold[0].CreateRevision != token {
		return false, core.KeyGone(holdKey)
	}
	return false, nil
}
