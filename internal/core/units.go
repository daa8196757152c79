package core

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A semaphore's permit of n units is one key, so that it is written, released, lost and
// fenced as one. Its weight is part of the key, so that a waiter learns it from a delete
// event or a keys-only read as well as from a full read, and never needs a value: a key of
// one unit lives where it always did, "<kind><lease hex>_<slot>", and a key of n > 1 units
// under "<kind>u<n>/". A lease in hex never starts with u, so the keys of more than one
// unit are exactly those under "<kind>u", and a Txn that counts the keys of kind reads
// those alone to turn the count into a weight.

// unitsMark starts the sub-prefix of the keys of more than one unit.
const unitsMark = "u"

// unitsKind is the kind of an acquisition of n units of kind: kind itself for one unit.
func unitsKind(kind string, n int) string {
	if n == 1 {
		return kind
	}
	return kind + unitsMark + strconv.Itoa(n) + "/"
}

// weigher weighs the keys of one range: a key under its prefix (the range + unitsMark)
// weighs the n of its "u<n>/", every other key 1. The zero weigher weighs every key 1.
type weigher string

func weigherOf(q *Queue, spec Spec) weigher {
	if !spec.weighted() {
		return ""
	}
	return weigher(q.prefix + spec.Ahead + unitsMark)
}

// of is the weight of key. A key under the prefix that does not say a weight (written by
// hand) weighs 1.
func (w weigher) of(key string) int {
	if w == "" || !strings.HasPrefix(key, string(w)) {
		return 1
	}
	rest := key[len(w):]
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return 1
	}
	n, err := strconv.ParseInt(rest[:i], 10, 32)
	if err != nil || n < 1 {
		return 1
	}
	return int(n)
}

// KeyUnits is how many units the key of a permit under kindPrefix (a name's prefix and
// its kind) holds: the n of "<kindPrefix>u<n>/", else 1.
func KeyUnits(kindPrefix, key string) int { return weigher(kindPrefix + unitsMark).of(key) }

// heavy is the extra weight of kvs, keys read from w's prefix: what they weigh beyond one each.
func (w weigher) heavy(kvs []*mvccpb.KeyValue) int {
	extra := 0
	for _, kv := range kvs {
		extra += w.of(string(kv.Key)) - 1
	}
	return extra
}

// ahead is the weight of the keys of kvs created before rev.
func (w weigher) ahead(kvs []*mvccpb.KeyValue, rev int64) int {
	n := 0
	for _, kv := range kvs {
		if kv.CreateRevision < rev {
			n += w.of(string(kv.Key))
		}
	}
	return n
}

// reads are the ops that read what is in aheadRange, for weight: its count, and with a
// weigher the keys of more than one unit too.
func (w weigher) reads(aheadRange string) []clientv3.Op {
	count := clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if w == "" {
		return []clientv3.Op{count}
	}
	return []clientv3.Op{count, clientv3.OpGet(string(w), clientv3.WithPrefix(), clientv3.WithKeysOnly())}
}

// nreads is how many ops reads makes.
func (w weigher) nreads() int {
	if w == "" {
		return 1
	}
	return 2
}

// weight is the weight of the range that the first ops of resps read (see reads).
func (w weigher) weight(resps []*etcdserverpb.ResponseOp) int {
	n := int(resps[0].GetResponseRange().Count)
	if w != "" {
		n += w.heavy(resps[1].GetResponseRange().Kvs)
	}
	return n
}

// HeldUnits is the weight of the keys of kind that hold now on a semaphore of limit units:
// the longest run of them, oldest first, whose weights add up to no more than limit (a key
// holds once what is ahead of it and its own weight fit, and what is ahead only shrinks, so
// the keys that hold are always the oldest). One Range of at most limit keys, without
// values, linearizable, retried through leader changes of etcd until ctx ends.
func (q *Queue) HeldUnits(ctx context.Context, kind string, limit int) (int, error) {
	w := weigher(q.prefix + kind + unitsMark)
	resp, err := retry(ctx, func() (*clientv3.GetResponse, error) {
		return q.cli.Get(clientv3.WithRequireLeader(ctx), q.prefix+kind, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(limit)))
	})
	if err != nil {
		return 0, fmt.Errorf("read the keys under %s: %w", q.prefix+kind, err)
	}
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	served := Served(q.prefix, keys, func(rel string) (Spec, bool) {
		return Spec{Kind: kind, Ahead: kind, Capacity: limit, Weight: w.of(q.prefix + rel)}, true
	})
	held := 0
	for i, k := range keys {
		if served[i] {
			held += w.of(k)
		}
	}
	return held, nil
}

// Served reports which keys of a name the queue serves now, by the one rule every
// acquisition waits on (see Spec): a key is served once the keys ahead of it, those created
// before it under its spec's Ahead, weigh less than its threshold. keys are the name's keys
// (under prefix) in create-revision order; specOf gives the spec each was written with, from
// its key relative to prefix, or false for a key that is no acquisition (a record), which is
// neither served nor counted. The command's status and the semaphore's InUse decide by it.
func Served(prefix string, keys []string, specOf func(rel string) (Spec, bool)) []bool {
	served := make([]bool, len(keys))
	specs := make([]Spec, len(keys))
	acq := make([]bool, len(keys))
	for i, k := range keys {
		specs[i], acq[i] = specOf(strings.TrimPrefix(k, prefix))
	}
	for i := range keys {
		if !acq[i] {
			continue
		}
		spec := specs[i]
		w := weigher("")
		if spec.weighted() {
			w = weigher(prefix + spec.Ahead + unitsMark)
		}
		ahead := 0
		for j := range i {
			if acq[j] && strings.HasPrefix(keys[j], prefix+spec.Ahead) {
				ahead += w.of(keys[j])
			}
		}
		served[i] = ahead < spec.slots()
	}
	return served
}
