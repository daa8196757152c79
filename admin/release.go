package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// ErrNoHold: no key of a name has the token given (the hold ended, or the name was taken
// again since): Release or Ask changed nothing.
var ErrNoHold = errors.New("etcdsync/admin: no hold with that token")

// recordTTL is how long the record of an operator's release stays for its holder to read:
// long enough for a holder cut off from etcd for a while.
const recordTTL = 10 * time.Minute

// maxReason bounds a release's reason, which etcd keeps in its record.
const maxReason = 1024

// Record is what an operator's release leaves beside the key it deleted, for its holder,
// whose loss then says why (its Err matches etcdsync.ErrReleasedByOperator); and what an
// ask leaves beside the key asked (see Ask).
type Record = core.ReleaseRecord

// Release ends the hold of names whose token is token, as an operator: it deletes the key
// of each name that has that token (one Txn, fenced on the token: a name taken again since
// is never touched) and leaves beside each a Record with reason, which the holder reads to
// say why it lost its hold; the record goes after ten minutes. Several names release a
// Multi's keys, which share one token, at once. It works on a hold or a waiter of every
// primitive.
//
// Errors: ErrInvalidName or ErrInvalidOption (a token below 1, a reason over 1 KiB), or
// ErrNoHold when a name has no key with that token; then nothing is written. Cost: one
// Range per name, a lease Grant and one Txn.
func Release(ctx context.Context, cli *clientv3.Client, names []string, token int64, reason string, opts ...Option) error {
	c, err := configure(names, opts)
	switch {
	case err != nil:
		return err
	case len(names) == 0:
		return fmt.Errorf("%w: no name", core.ErrInvalidName)
	case token < 1:
		return fmt.Errorf("%w: token %d", core.ErrInvalidOption, token)
	case len(reason) > maxReason:
		return fmt.Errorf("%w: a reason of %d bytes, more than %d", core.ErrInvalidOption, len(reason), maxReason)
	}
	var keys []string
	prefixOf := make(map[int]string, len(names))
	for _, name := range names {
		keyPrefix := c.keyPrefix(name)
		found, err := keyOfToken(ctx, cli, name, keyPrefix, token)
		if err != nil {
			return err
		}
		prefixOf[len(keys)] = keyPrefix
		keys = append(keys, found)
	}
	value, err := json.Marshal(Record{Reason: reason, By: operator(), At: time.Now().UTC(), Token: token})
	if err != nil {
		return err
	}
	lease, err := cli.Grant(clientv3.WithRequireLeader(ctx), int64(recordTTL/time.Second))
	if err != nil {
		return fmt.Errorf("grant the record's lease: %w", err)
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for i, key := range keys {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", token))
		ops = append(ops, clientv3.OpDelete(key), clientv3.OpPut(core.ReleaseRecordKey(prefixOf[i], key), string(value), clientv3.WithLease(lease.ID)))
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Then(ops...).Commit()
	if err == nil && resp.Succeeded {
		return nil
	}
	// Nothing was written, or it cannot be told: the record's lease goes either way only
	// when nothing was (a record of a release that happened must stay).
	if err == nil {
		_, _ = cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		return fmt.Errorf("%w: a key of token %d went meanwhile", ErrNoHold, token)
	}
	return fmt.Errorf("release %s: %w", strings.Join(keys, ", "), err)
}

// operator is user@host of this process, as far as it can tell.
func operator() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return name + "@" + host
}
