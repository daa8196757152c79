package core

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Record writes value at key unless the key exists, and returns what the key holds then:
// value if this call or an earlier one wrote it, else what another writer recorded first.
// The key has no lease: it outlives every session. One Txn, retried through leader changes
// (a retry of a put that was applied finds its own value).
func Record(ctx context.Context, cli *clientv3.Client, key, value string) (stored string, err error) {
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, value)).
			Else(clientv3.OpGet(key)).
			Commit()
	})
	switch {
	case err != nil:
		return "", fmt.Errorf("record %s: %w", key, err)
	case resp.Succeeded:
		return value, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // deleted between the compare and the read cannot happen in one Txn
		return "", fmt.Errorf("record %s: key vanished inside a Txn", key)
	}
	return string(kvs[0].Value), nil
}
