package admin

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// findPage is how many keys one Range of findNames reads.
const findPage = 1000

// findNames finds the names under prefix ("": at the root of the keyspace, where every name
// goes by default, beside whatever else etcd holds): each key prefix + escaped name + "/" +
// rest, where rest has the shape of a holder's or waiter's key (syncKeyShape), belongs to the
// name. It reads the keys without their values, findPage at a time, all at the revision of
// the first page, which it returns.
func findNames(ctx context.Context, cli *clientv3.Client, prefix string) ([]nameRange, int64, error) {
	key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	if prefix == "" {
		key = "\x00" // the whole keyspace: etcd takes no empty key
	}
	var found []nameRange
	seen := map[string]bool{}
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(findPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(clientv3.WithRequireLeader(ctx), key, opts...)
		if err != nil {
			return nil, 0, fmt.Errorf("find the names under %q: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			escaped, rest, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
			// No name holds a NUL byte: such a key is a record beside a name's keys
			// (core.ReleaseRecordKey, core.HandoverRecordKey).
			if ok && escaped != "" && !seen[escaped] && !strings.Contains(escaped, "\x00") && syncKeyShape(rest) {
				seen[escaped] = true
				found = append(found, nameRange{name: core.UnescapeName(escaped), keyPrefix: prefix + escaped + "/"})
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return found, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// syncKeyShape reports whether rest, what follows a name's prefix in a key, has the shape of
// a holder's or waiter's key (core.ParseKey), or is a record of a semaphore, a barrier, a
// gate or a latch.
func syncKeyShape(rest string) bool {
	if core.IsRecord(rest) || gatheringRecord(rest) {
		return true
	}
	_, ok := core.ParseKey(rest)
	return ok
}

// hasSyncKeys reports whether the keys under keyPrefix, those of a name findNames found,
// are those of a primitive: one of the shape of a holder's key has a lease (every holder's
// and waiter's key has one), or the limit record is a number, or a latch's record holds a
// count, or a gate's names its owner. Application data that happens to have that shape
// ("users/42") has none of them.
func hasSyncKeys(keyPrefix string, kvs []*mvccpb.KeyValue) bool {
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), keyPrefix)
		if _, err := strconv.Atoi(string(kv.Value)); rest == core.RecordLimit && err == nil {
			return true
		}
		if kv.Lease != 0 && syncKeyShape(rest) {
			return true
		}
		// A latch or a gate has no lease: its record says what it is.
		if _, _, err := core.LatchCount(kv, 0); rest == core.LatchKey && err == nil {
			return true
		}
		if rest == core.GateKey && parseOwner(string(kv.Value)) != nil {
			return true
		}
	}
	return false
}

// gatheringRecord reports whether rest is a record of a barrier, a gate or a latch (see
// package core's keys.go).
func gatheringRecord(rest string) bool {
	switch rest {
	case core.RecordRound, core.RecordSize, core.GateKey, core.LatchKey:
		return true
	}
	return strings.HasPrefix(rest, core.LatchKey+"/")
}
