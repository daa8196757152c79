package core

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Put writes value into the hold's key, bound to the same lease, only while the key is
// still the one the hold created (IsOwner): a hold that was lost writes nothing. It reports
// whether it wrote. One Txn, retried through leader changes until ctx ends; a retry of a put
// whose answer was lost writes the same value again, which changes only the key's revision.
func (h *Hold) Put(ctx context.Context, value string) (written bool, err error) {
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return h.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(h.IsOwner()).
			Then(clientv3.OpPut(h.key, value, clientv3.WithLease(h.sess.Lease()))).
			Commit()
	})
	if err != nil {
		return false, fmt.Errorf("put %s: %w", h.key, err)
	}
	return resp.Succeeded, nil
}
