package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Ask asks the hold of name whose token is token to let go, as an operator or a waiter:
// it leaves a Record with reason beside the hold's key (one Txn, fenced on the token: a
// name taken again since is never asked), and the holder's Asked channel closes (see Asking
// a holder to let go in package etcdsync). It returns once the ask is written; the holder
// decides when to let go. The record goes after ten minutes. An ask of a waiter's key is
// told to it once it holds, within that time. A Multi's holder is asked through any of its
// names.
//
// Errors: ErrInvalidName, or ErrInvalidOption (a token below 1, an empty reason or one over
// 1 KiB), or ErrNoHold when name has no key with that token; then nothing is written.
// Cost: one Range, a lease Grant and one Txn.
func Ask(ctx context.Context, cli *clientv3.Client, name string, token int64, reason string, opts ...Option) error {
	c, err := configure([]string{name}, opts)
	switch {
	case err != nil:
		return err
	case token < 1:
		return fmt.Errorf("%w: token %d", core.ErrInvalidOption, token)
	case reason == "":
		return fmt.Errorf("%w: no reason: the holder is told why it is asked", core.ErrInvalidOption)
	case len(reason) > maxReason:
		return fmt.Errorf("%w: a reason of %d bytes, more than %d", core.ErrInvalidOption, len(reason), maxReason)
	}
	keyPrefix := c.keyPrefix(name)
	key, err := keyOfToken(ctx, cli, name, keyPrefix, token)
	if err != nil {
		return err
	}
	value, err := json.Marshal(Record{Reason: reason, By: operator(), At: time.Now().UTC(), Token: token})
	if err != nil {
		return err
	}
	lease, err := cli.Grant(clientv3.WithRequireLeader(ctx), int64(recordTTL/time.Second))
	if err != nil {
		return fmt.Errorf("grant the ask's lease: %w", err)
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
		Then(clientv3.OpPut(core.AskRecordKey(keyPrefix, key), string(value), clientv3.WithLease(lease.ID))).
		Commit()
	switch {
	case err == nil && resp.Succeeded:
		return nil
	case err == nil:
		_, _ = cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		return fmt.Errorf("%w: the key of token %d went meanwhile", ErrNoHold, token)
	}
	return fmt.Errorf("ask %s: %w", key, err)
}

// keyOfToken is the key of name, under keyPrefix, created at token; ErrNoHold for none.
// One Range.
func keyOfToken(ctx context.Context, cli *clientv3.Client, name, keyPrefix string, token int64) (string, error) {
	resp, err := cli.Get(clientv3.WithRequireLeader(ctx), keyPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return "", fmt.Errorf("read %q: %w", name, err)
	}
	for _, kv := range resp.Kvs {
		// A semaphore's limit record may have been written with its first permit.
		if kv.CreateRevision == token && !core.IsRecord(strings.TrimPrefix(string(kv.Key), keyPrefix)) {
			return string(kv.Key), nil
		}
	}
	return "", fmt.Errorf("%w: %q has no key of token %d", ErrNoHold, name, token)
}
