//go:build unix

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// snapshot is what status shows: the queue of every name at one revision.
type snapshot struct {
	Revision int64        `json:"revision"`
	Names    []nameStatus `json:"names"`
}

// nameStatus is the queue of one name, in the order its holders are served.
type nameStatus struct {
	Name      string  `json:"name"`
	Prefix    string  `json:"prefix"`          // where its keys live
	Primitive string  `json:"primitive"`       // lock, election, rwmutex, semaphore; "" without keys
	Limit     *int    `json:"limit,omitempty"` // a semaphore's, from its limit record
	Queue     []entry `json:"queue"`
}

// entry is one holder or waiter: one key.
type entry struct {
	Position int               `json:"position"`        // 1 is served first
	Kind     string            `json:"kind"`            // read, write, permit, candidate or lock
	Units    int               `json:"units,omitempty"` // a permit's, when more than one
	State    string            `json:"state"`           // holds, leads (a candidate that holds), waits, unknown
	Key      string            `json:"key"`
	Token    int64             `json:"token"`           // the key's create revision
	Lease    string            `json:"lease,omitempty"` // hex, as in the key
	TTL      *int64            `json:"ttl,omitempty"`   // seconds the lease has left; -1 expired; absent if unknown
	Owner    map[string]string `json:"owner"`           // the value's key=value fields; null if it names no owner
	Value    string            `json:"value"`

	lease clientv3.LeaseID
}

// The kinds of key under a name, and their states.
const (
	kindRead      = "read"
	kindWrite     = "write"
	kindPermit    = "permit"
	kindLock      = "lock"
	kindCandidate = "candidate"

	stateHolds   = "holds"
	stateLeads   = "leads"
	stateWaits   = "waits"
	stateUnknown = "unknown"
)

// readSnapshot reads the names (or the names findNames finds under prefix if names is empty)
// at one revision, then the TTL of each distinct lease: one LeaseTimeToLive per lease.
func readSnapshot(ctx context.Context, cli *clientv3.Client, prefix string, names []string, exclusive string) (*snapshot, error) {
	var targets []nameRange
	var rev int64
	if len(names) > 0 {
		for _, n := range names {
			targets = append(targets, nameRange{name: n, keyPrefix: prefix + core.NamePrefix(n)})
		}
	} else {
		var err error
		if targets, rev, err = findNames(ctx, cli, prefix); err != nil {
			return nil, err
		}
	}
	keyPrefixes := make([]string, len(targets))
	for i, t := range targets {
		keyPrefixes[i] = t.keyPrefix
	}
	kvsOf, rev, err := readRanges(ctx, cli, keyPrefixes, rev)
	if err != nil {
		return nil, err
	}
	snap := &snapshot{Revision: rev, Names: []nameStatus{}}
	for i, t := range targets {
		if len(names) == 0 && !hasSyncKeys(t.keyPrefix, kvsOf[i]) {
			continue // found by the shape of its keys, but they are other data
		}
		snap.Names = append(snap.Names, queueOf(t.name, t.keyPrefix, kvsOf[i], exclusive))
	}
	if err := readTTLs(ctx, cli, snap); err != nil {
		return nil, err
	}
	return snap, nil
}

// nameRange is a name and where its keys are.
type nameRange struct {
	name      string
	keyPrefix string
}

// rangesOf is what status watches: the key prefix of each name, or all of prefix without
// names.
func rangesOf(prefix string, names []string) []string {
	if len(names) == 0 {
		return []string{prefix}
	}
	ranges := make([]string, len(names))
	for i, n := range names {
		ranges[i] = prefix + core.NamePrefix(n)
	}
	return ranges
}

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
			if ok && escaped != "" && !seen[escaped] && syncKeyShape(rest) {
				seen[escaped] = true
				found = append(found, nameRange{name: unescapeName(escaped), keyPrefix: prefix + escaped + "/"})
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return found, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// syncKeyShape reports whether rest, what follows a name's prefix in a key, has the shape of
// a holder's or waiter's key: a lease in hex (etcd's concurrency.Mutex and Election,
// etcdctl lock and elect), with "_" and a slot (etcdsync), or a time in decimal (etcd's
// recipe.RWMutex), perhaps under read/, write/, permit/ or permit/uK/; or a semaphore's
// limit record.
func syncKeyShape(rest string) bool {
	if rest == core.RecordLimit {
		return true
	}
	for _, kind := range []string{core.KindRead, core.KindWrite, core.KindPermit} {
		if r, ok := strings.CutPrefix(rest, kind); ok {
			rest = r
			if units, r, ok := strings.Cut(r, "/"); kind == core.KindPermit && ok && len(units) > 1 && units[0] == 'u' && allOf(units[1:], "0123456789") {
				rest = r
			}
			break
		}
	}
	id, slot, hasSlot := strings.Cut(rest, "_")
	return allOf(id, "0123456789abcdef") && (!hasSlot || allOf(slot, "0123456789"))
}

// allOf reports whether s is not empty and has only runes of set.
func allOf(s, set string) bool {
	return s != "" && strings.Trim(s, set) == ""
}

// hasSyncKeys reports whether the keys under keyPrefix, those of a name findNames found,
// are those of a primitive: one of the shape of a holder's key has a lease (every holder's
// and waiter's key has one), or the limit record is a number. Application data that happens
// to have that shape ("users/42") has neither.
func hasSyncKeys(keyPrefix string, kvs []*mvccpb.KeyValue) bool {
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), keyPrefix)
		if _, err := strconv.Atoi(string(kv.Value)); rest == core.RecordLimit && err == nil {
			return true
		}
		if kv.Lease != 0 && syncKeyShape(rest) {
			return true
		}
	}
	return false
}

// maxOpsPerTxn is how many ranges readRanges reads in one Txn at first: etcd refuses a Txn of
// more than its --max-txn-ops (128 by default).
const maxOpsPerTxn = 100

// readRanges reads the keys under each of prefixes, at revision rev (0: the present), and
// returns them with the revision read. It reads in Txns of up to maxOpsPerTxn ranges, every
// one after the first at the first's revision, so that the whole is one consistent view.
// When etcd refuses a Txn as too large (a server started with a lower --max-txn-ops), it
// tries again with pieces half as large, down to single Ranges, which need no Txn.
func readRanges(ctx context.Context, cli *clientv3.Client, prefixes []string, rev int64) ([][]*mvccpb.KeyValue, int64, error) {
	kvsOf := make([][]*mvccpb.KeyValue, 0, len(prefixes))
	piece := maxOpsPerTxn
	for len(kvsOf) < len(prefixes) {
		chunk := prefixes[len(kvsOf):min(len(prefixes), len(kvsOf)+piece)]
		ops := make([]clientv3.Op, len(chunk))
		for i, p := range chunk {
			opts := []clientv3.OpOption{clientv3.WithPrefix()}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			ops[i] = clientv3.OpGet(p, opts...)
		}
		var ranges []*clientv3.GetResponse
		if len(ops) == 1 {
			resp, err := cli.Do(clientv3.WithRequireLeader(ctx), ops[0])
			if err != nil {
				return nil, 0, fmt.Errorf("read %s: %w", chunk[0], err)
			}
			ranges = append(ranges, resp.Get())
		} else {
			resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
			if errors.Is(err, rpctypes.ErrTooManyOps) {
				piece = max(1, len(ops)/2)
				continue
			}
			if err != nil {
				return nil, 0, fmt.Errorf("read %s: %w", strings.Join(chunk, ", "), err)
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			for _, r := range resp.Responses {
				ranges = append(ranges, (*clientv3.GetResponse)(r.GetResponseRange()))
			}
		}
		for _, r := range ranges {
			if rev == 0 {
				rev = r.Header.Revision
			}
			kvsOf = append(kvsOf, r.Kvs)
		}
	}
	return kvsOf, rev, nil
}

// unescapeName undoes core.NamePrefix's escapes of '%' and '/'.
func unescapeName(escaped string) string {
	return strings.NewReplacer("%2F", "/", "%25", "%").Replace(escaped)
}

// queueOf orders the keys of one name by create revision and decides who holds, by the
// rules of the primitives: an exclusive key (lock, candidate, write) holds when no key is
// ahead of it; a read key when no write or exclusive key is; a permit when its units fit
// within the limit beside those of the permits ahead of it.
func queueOf(name, keyPrefix string, kvs []*mvccpb.KeyValue, exclusive string) nameStatus {
	ns := nameStatus{Name: name, Prefix: keyPrefix, Queue: []entry{}}
	kinds := map[string]bool{}
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), keyPrefix)
		if rest == core.RecordLimit {
			if limit, err := strconv.Atoi(string(kv.Value)); err == nil {
				ns.Limit = &limit
			}
			kinds[kindPermit] = true
			continue
		}
		kind := exclusive
		switch {
		case strings.HasPrefix(rest, core.KindRead):
			kind = kindRead
		case strings.HasPrefix(rest, core.KindWrite):
			kind = kindWrite
		case strings.HasPrefix(rest, core.KindPermit):
			kind = kindPermit
		}
		kinds[kind] = true
		units := 0
		if n := core.KeyUnits(keyPrefix+core.KindPermit, string(kv.Key)); kind == kindPermit && n > 1 {
			units = n
		}
		ns.Queue = append(ns.Queue, entry{
			Kind:  kind,
			Units: units,
			Key:   string(kv.Key),
			Token: kv.CreateRevision,
			Value: string(kv.Value),
			Owner: parseOwner(string(kv.Value)),
			lease: clientv3.LeaseID(kv.Lease),
		})
	}
	switch {
	case kinds[kindRead] || kinds[kindWrite]:
		ns.Primitive = "rwmutex"
	case kinds[kindPermit]:
		ns.Primitive = "semaphore"
	case kinds[kindCandidate]:
		ns.Primitive = "election"
	case kinds[kindLock]:
		ns.Primitive = "lock"
	}
	slices.SortFunc(ns.Queue, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.Token, b.Token), strings.Compare(a.Key, b.Key))
	})
	permitsAhead, exclusiveAhead := 0, false
	for i := range ns.Queue {
		e := &ns.Queue[i]
		e.Position = i + 1
		if e.lease != 0 {
			e.Lease = fmt.Sprintf("%x", int64(e.lease))
		}
		holds := false
		switch e.Kind {
		case kindRead:
			holds = !exclusiveAhead
		case kindPermit:
			if ns.Limit == nil {
				e.State = stateUnknown
			}
			units := max(e.Units, 1)
			holds = ns.Limit != nil && permitsAhead+units <= *ns.Limit
			permitsAhead += units
		default:
			holds = i == 0
			exclusiveAhead = true
		}
		switch {
		case e.State != "":
		case holds && e.Kind == kindCandidate:
			e.State = stateLeads
		case holds:
			e.State = stateHolds
		default:
			e.State = stateWaits
		}
	}
	return ns
}

// readTTLs fills in the TTL each key's lease has left: one LeaseTimeToLive per lease. A lease
// etcd will not tell about (a permission) has no TTL shown; it is no error.
func readTTLs(ctx context.Context, cli *clientv3.Client, snap *snapshot) error {
	ttls := map[clientv3.LeaseID]*int64{}
	for i := range snap.Names {
		for j := range snap.Names[i].Queue {
			e := &snap.Names[i].Queue[j]
			if e.lease == 0 {
				continue
			}
			ttl, seen := ttls[e.lease]
			if !seen {
				resp, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), e.lease)
				if ctx.Err() != nil {
					return fmt.Errorf("read the TTL of lease %x: %w", int64(e.lease), ctx.Err())
				}
				if err == nil {
					ttl = &resp.TTL
				}
				ttls[e.lease] = ttl
			}
			e.TTL = ttl
		}
	}
	return nil
}

// parseOwner reads the owner a key's value describes: space-separated key=value fields, of
// which host, pid and since name the owner ("host=web-3 pid=4711 since=2026-11-24T07:00:00Z",
// perhaps with more, such as owner=<uuid>). nil if the value has none of those three.
func parseOwner(value string) map[string]string {
	fields := map[string]string{}
	for f := range strings.FieldsSeq(value) {
		if k, v, ok := strings.Cut(f, "="); ok && k != "" {
			fields[k] = v
		}
	}
	for _, k := range []string{"host", "pid", "since"} {
		if _, ok := fields[k]; ok {
			return fields
		}
	}
	return nil
}
