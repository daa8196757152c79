package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// ErrInUse: Delete found a name held or waited for (a key on a lease, or a gate's key):
// it deleted nothing. The error names the keys and their owners.
var ErrInUse = errors.New("etcdsync/admin: the name is held or waited for")

// maxInUse is how many of the keys in use Delete's error names.
const maxInUse = 5

// Delete removes what names keep in etcd once nobody uses them: a semaphore's limit record
// and its markers, a barrier's records of its size and rounds, a latch's count and
// markers, a once job's record of the last period done (the next run then runs in any
// period). These have no lease, on purpose, so they last; with names made per tenant or
// per job they pile up, and a name once used by one kind of primitive refuses the others
// (ErrOtherKind) until they are gone. A name with nothing under it is no error.
//
// It deletes only while no key of a name is on a lease (a holder or a waiter of any kind,
// ours or etcd's) and no gate is held: one Txn for all the names, which compares that no
// key came under them since they were read, so a holder that arrives meanwhile keeps its
// key and Delete reads again.
//
// Errors: ErrInvalidName, ErrInvalidOption; ErrInUse naming who holds or waits, having
// deleted nothing. Cost: one Range per name and two Txns.
func Delete(ctx context.Context, cli *clientv3.Client, names []string, opts ...Option) error {
	c, err := configure(names, opts)
	switch {
	case err != nil:
		return err
	case len(names) == 0:
		return fmt.Errorf("%w: no name", core.ErrInvalidName)
	}
	var b core.Backoff
	for {
		done, err := deleteOnce(ctx, cli, c, names)
		if done || err != nil {
			return err
		}
		if err := core.Pause(ctx, b.Next()); err != nil {
			return err
		}
	}
}

// deleteOnce reads names and deletes their records unless one is in use; done is false
// when a key arrived between the read and the delete.
func deleteOnce(ctx context.Context, cli *clientv3.Client, c config, names []string) (done bool, err error) {
	reads := make([]clientv3.Op, len(names))
	for i, name := range names {
		reads[i] = clientv3.OpGet(c.keyPrefix(name), clientv3.WithPrefix())
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(reads...).Commit()
	if err != nil {
		return false, fmt.Errorf("read %s: %w", strings.Join(names, ", "), err)
	}
	rev := resp.Header.Revision
	var inUse []string
	var cmps []clientv3.Cmp
	var dels []clientv3.Op
	for i, name := range names {
		keyPrefix := c.keyPrefix(name)
		kvs := resp.Responses[i].GetResponseRange().Kvs
		for _, kv := range kvs {
			rest := strings.TrimPrefix(string(kv.Key), keyPrefix)
			if kv.Lease != 0 || core.UseOf(rest) == core.UseGate {
				who := string(kv.Key)
				if owner := parseOwner(string(kv.Value)); owner != nil {
					who += fmt.Sprintf(" (host=%s pid=%s)", owner["host"], owner["pid"])
				}
				inUse = append(inUse, who)
			}
		}
		if len(kvs) > 0 {
			// Nothing new under the name since the read; what went meanwhile is gone anyway.
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(keyPrefix), "<", rev+1).WithPrefix())
			dels = append(dels, clientv3.OpDelete(keyPrefix, clientv3.WithPrefix()))
		}
	}
	if len(inUse) > 0 {
		more := ""
		if len(inUse) > maxInUse {
			more = fmt.Sprintf(" and %d more", len(inUse)-maxInUse)
			inUse = inUse[:maxInUse]
		}
		return true, fmt.Errorf("%w: %s%s", ErrInUse, strings.Join(inUse, ", "), more)
	}
	if len(dels) > 0 {
		tresp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Then(dels...).Commit()
		if err != nil {
			return false, fmt.Errorf("delete %s: %w", strings.Join(names, ", "), err)
		}
		if !tresp.Succeeded {
			return false, nil
		}
	}
	return true, deleteOnceRecords(ctx, cli, c, names)
}

// deleteOnceRecords deletes the once jobs' records of names, which lie beside the names'
// keys (core.OnceRecordKey): one Txn. A user whose role grants the names' prefixes alone
// cannot reach them, and so never wrote one: a refusal is no error.
func deleteOnceRecords(ctx context.Context, cli *clientv3.Client, c config, names []string) error {
	dels := make([]clientv3.Op, len(names))
	for i, name := range names {
		dels[i] = clientv3.OpDelete(core.OnceRecordKey(c.keyPrefix(name)))
	}
	_, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(dels...).Commit()
	if err != nil && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		return fmt.Errorf("delete the once records of %s: %w", strings.Join(names, ", "), err)
	}
	return nil
}
