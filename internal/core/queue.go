package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Queue is the wait-for-predecessor queue of one name. An acquisition writes one key under
// the name prefix, bound to the session's lease; its create revision is its place in line
// and its fencing token. Keys created later are behind it, so the set of keys ahead only
// shrinks: one snapshot taken in the writing Txn plus the delete events after it tell a
// waiter when it is served, with no polling.
type Queue struct {
	cli      *clientv3.Client
	sessions Sessions
	prefix   string // NamePrefix of the name
	arrivals bool   // the client's watch on the name delivers new keys too (see WatchArrivals)
	life     life   // of its holds: WithMaxHold, WithLockDelay
	// unguarded: etcd refused this client a read of the name's other kinds' ranges (a
	// user granted only its kind's sub-ranges), so its writes compare no Claim.Guard.
	unguarded atomic.Bool
}

// NewQueue returns the queue of name, configured by c. It does no I/O.
func NewQueue(cli *clientv3.Client, c Config, name string) *Queue {
	return NewQueues(cli, c, []string{name})[0]
}

// NewQueues returns the queues of names, configured by c, with one session source: the
// queues of an acquisition of several names (AcquireAll). It does no I/O.
func NewQueues(cli *clientv3.Client, c Config, names []string) []*Queue {
	sessions := SessionsFor(cli, c)
	qs := make([]*Queue, len(names))
	for i, name := range names {
		qs[i] = &Queue{cli: cli, sessions: sessions, prefix: c.KeyPrefix(name), life: lifeOf(c)}
	}
	return qs
}

// WatchArrivals makes the queue's watch deliver new keys as well as deletes, which
// WatchBehind needs, and returns q. It costs one more event per acquisition on the name for
// each client that waits on it. Call it before the first use.
func (q *Queue) WatchArrivals() *Queue {
	q.arrivals = true
	return q
}

func (q *Queue) hubKey() hubKey {
	k := hubKey{cli: q.cli, prefix: q.prefix, mode: deletesOnly}
	if q.arrivals {
		k.mode = arrivals
	}
	return k
}

// Prefix is the key prefix of the queue's name.
func (q *Queue) Prefix() string { return q.prefix }

// Client is the etcd client the queue works through.
func (q *Queue) Client() *clientv3.Client { return q.cli }

// Spec describes one kind of acquisition in the queue's own terms: what kind of key it
// writes, which keys it waits behind, and how many units it takes of how many the name has.
// Core derives the rest: the key's sub-prefix (which carries a weight above one, see
// unitsKind) and the threshold a waiter is served at.
type Spec struct {
	Kind  string // sub-prefix of the acquisition's key under the name ("" for a mutex)
	Ahead string // sub-prefix whose earlier keys count against it ("" for every kind)
	// Capacity is how many units the keys of Ahead may hold at once (0 means 1), and Weight
	// how many this acquisition takes (0 means 1; at most Capacity). It is served once the
	// keys ahead of it weigh no more than Capacity-Weight. With a Capacity above 1 a key may
	// weigh more than one unit: the acquiring Txn then also reads the keys that do.
	Capacity, Weight int
	Value            string // stored in the key
	// Tel, if not nil, records where a blocking acquisition joined the line.
	Tel *Telemetry
	// Guard, if not empty, is ANDed into the If of every Txn that may write the key: when
	// it fails, the acquisition writes nothing and returns ErrGuard (see acquire.go).
	Guard []clientv3.Cmp
	// CapacityMark, if not empty, says that Capacity may change while the acquisition
	// waits: a key "<CapacityMark><n>" under the name says the capacity in force, and its
	// delete that it changed (see records.go). The keys ahead are then weighed whatever
	// Capacity is.
	CapacityMark string
	// Passes, if not empty, are the modes (see mode.go) of keys of Ahead that do not count
	// against it: a reader passes a write key whose hold became a read, or an upgradable
	// read. The keys ahead are then read with their values, and their changes of mode are
	// heard as puts (the queue must watch arrivals; an approaching waiter watches the keys
	// it picked for puts too).
	Passes []string
	// Use, if not 0, is what the acquisition uses the name as: every Txn that may write
	// the key also compares that no key of another use is under the name (Claim.Guard), and
	// fails with ErrOtherKind, naming it, when one is.
	Use Use
	// Handover, for an election's candidate, says that its key may be deleted by a handover
	// of the leader's key to it (see handover.go): a wait that sees its key deleted then
	// reads the record of the handover, and holds that key if it was handed it.
	Handover bool
}

func (s Spec) capacity() int { return max(s.Capacity, 1) }

// full is what a try that would wait says: ErrNoPermits when the spec counts units of a
// capacity above one, else ErrLocked.
func (s Spec) full() error {
	if s.weighted() {
		return ErrNoPermits
	}
	return ErrLocked
}

func (s Spec) weight() int { return max(s.Weight, 1) }

// slots is the threshold of the spec: it is served once what is ahead weighs less.
func (s Spec) slots() int { return s.capacity() - s.weight() + 1 }

// weighted reports whether the keys ahead may weigh more than one unit each.
func (s Spec) weighted() bool { return s.capacity() > 1 || s.CapacityMark != "" }

// keyKind is the sub-prefix the acquisition's key goes under: Kind, with its weight when
// above one (see unitsKind).
func (s Spec) keyKind() string { return unitsKind(s.Kind, s.weight()) }

// A semaphore's permit of n units is one key, so that it is written, released, lost and
// fenced as one. Its weight is part of the key, so that a waiter learns it from a delete
// event or a keys-only read as well as from a full read, and never needs a value: a key of
// one unit lives where it always did, "<kind><lease hex>_<slot>", and a key of n > 1 units
// under "<kind>u<n>/". A lease in hex never starts with u, so the keys of more than one
// unit are exactly those under "<kind>u", and a Txn that counts the keys of kind reads
// those alone to turn the count into a weight.

// unitsKind is the kind of an acquisition of n units of kind: kind itself for one unit.
func unitsKind(kind string, n int) string {
	if n == 1 {
		return kind
	}
	return kind + unitsMark + strconv.Itoa(n) + "/"
}

// weigher weighs the keys of one range: a key under units (the range + unitsMark) weighs
// the n of its "u<n>/", every other key 1; with passes, a key whose value's mode is one of
// them (see mode.go) weighs nothing, so the range is read with values. The zero weigher
// weighs every key 1.
type weigher struct {
	units  string
	passes []string
}

func weigherOf(q *Queue, spec Spec) weigher {
	w := weigher{passes: spec.Passes}
	if spec.weighted() {
		w.units = q.prefix + spec.Ahead + unitsMark
	}
	return w
}

// of is the weight of key, whatever its value. A key under the prefix that does not say a
// weight as ParseKey reads it (written by hand) weighs 1.
func (w weigher) of(key string) int {
	if w.units == "" || !strings.HasPrefix(key, w.units) {
		return 1
	}
	units, _, found := strings.Cut(key[len(w.units)-len(unitsMark):], "/")
	if n, ok := unitsOf(units); found && ok {
		return n
	}
	return 1
}

// kv is the weight of kv, read with its value when the weigher has passes, for a waiter
// whose key was created at rev.
func (w weigher) kv(kv *mvccpb.KeyValue, rev int64) int {
	return w.ofMode(string(kv.Key), ModeOf(string(kv.Value)), kv.ModRevision, rev)
}

// passing reports whether a key in mode, written at modRev, weighs nothing for a waiter
// whose key was created at rev: its mode is one the weigher passes, or it is an upgrade
// under way that the waiter came before, and the waiter passes upgradable reads.
func (w weigher) passing(mode string, modRev, rev int64) bool {
	if len(w.passes) == 0 {
		return false
	}
	if mode == ModeUpgrading {
		return rev < modRev && slices.Contains(w.passes, ModeUpgradable)
	}
	return slices.Contains(w.passes, mode)
}

// ofMode is the weight of key in mode, written at modRev, for a waiter created at rev.
func (w weigher) ofMode(key, mode string, modRev, rev int64) int {
	if w.passing(mode, modRev, rev) {
		return 0
	}
	return w.of(key)
}

// KeyUnits is how many units the key of a permit under kindPrefix (a name's prefix and
// its kind) holds: the n of "<kindPrefix>u<n>/", else 1.
func KeyUnits(kindPrefix, key string) int { return weigher{units: kindPrefix + unitsMark}.of(key) }

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
			n += w.kv(kv, rev)
		}
	}
	return n
}

// keys are the options of a read of the range for ahead: keys only, unless the weigher
// needs values.
func (w weigher) keys() []clientv3.OpOption {
	if len(w.passes) > 0 {
		return []clientv3.OpOption{clientv3.WithPrefix()}
	}
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly()}
}

// reads are the ops that read what is in aheadRange, for weight: its count, and with units
// the keys of more than one unit too; with passes, every key with its value.
func (w weigher) reads(aheadRange string) []clientv3.Op {
	if len(w.passes) > 0 {
		return []clientv3.Op{clientv3.OpGet(aheadRange, clientv3.WithPrefix())}
	}
	count := clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if w.units == "" {
		return []clientv3.Op{count}
	}
	return []clientv3.Op{count, clientv3.OpGet(w.units, clientv3.WithPrefix(), clientv3.WithKeysOnly())}
}

// nreads is how many ops reads makes.
func (w weigher) nreads() int {
	if w.units == "" || len(w.passes) > 0 {
		return 1
	}
	return 2
}

// weight is the weight of the range that the first ops of resps read (see reads).
func (w weigher) weight(resps []*etcdserverpb.ResponseOp) int {
	if len(w.passes) > 0 {
		return w.ahead(resps[0].GetResponseRange().Kvs, math.MaxInt64)
	}
	n := int(resps[0].GetResponseRange().Count)
	if w.units != "" {
		n += w.heavy(resps[1].GetResponseRange().Kvs)
	}
	return n
}

// HeldUnits is the weight of the keys of kind that hold now on a semaphore, and its limit,
// both as of one revision: etcd's record of the limit (known without one), and the permits
// that hold by heldPermits (see records.go). One Txn of the record, its marker and at most
// known permit keys without values, and one more if the record says more (permits beyond
// the limit still hold after a lowering: at most as many as were read when it was made);
// linearizable, retried through leader changes of etcd until ctx ends.
func (q *Queue) HeldUnits(ctx context.Context, kind string, known int) (held, limit int, err error) {
	w := weigher{units: q.prefix + kind + unitsMark}
	for most := known; ; {
		resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return q.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(append(LimitReads(q.prefix),
				clientv3.OpGet(q.prefix+kind, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(most))))...).Commit()
		})
		if err != nil {
			return 0, 0, fmt.Errorf("read the keys under %s: %w", q.prefix+kind, err)
		}
		l, err := LimitOf(q.prefix, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
		if err != nil {
			return 0, 0, err
		}
		if l.N == 0 {
			l.N = known
		}
		permits := resp.Responses[2].GetResponseRange().Kvs
		holds := HeldPermits(q.prefix, kind, permits, l)
		if n := len(permits); n == most && holds[n-1] && resp.Responses[2].GetResponseRange().More {
			most *= 2 // the last one read holds: the next may too
			continue
		}
		for i, kv := range permits {
			if holds[i] {
				held += w.of(string(kv.Key))
			}
		}
		return held, l.N, nil
	}
}

// QueuedKey is one key of a name as Served weighs it: the key, its create revision, and
// its value's mode with the revision that wrote it.
type QueuedKey struct {
	Key             string
	Created, ModRev int64
	Mode            string
}

// Served reports which keys of a name the queue serves now, by the one rule every
// acquisition waits on (see Spec): a key is served once the keys ahead of it, those created
// before it under its spec's Ahead, weigh less than its threshold (a key whose mode its
// spec passes weighs nothing). keys are the name's keys (under prefix) in create-revision
// order; specOf gives the spec each was written with, from its key relative to prefix and
// its mode, or false for a key that is no acquisition (a record), which is neither served
// nor counted. The command's status decides by it.
func Served(prefix string, keys []QueuedKey, specOf func(rel, mode string) (Spec, bool)) []bool {
	served := make([]bool, len(keys))
	specs := make([]Spec, len(keys))
	acq := make([]bool, len(keys))
	for i, k := range keys {
		specs[i], acq[i] = specOf(strings.TrimPrefix(k.Key, prefix), k.Mode)
	}
	for i, k := range keys {
		if !acq[i] {
			continue
		}
		spec := specs[i]
		w := weigher{passes: spec.Passes}
		if spec.weighted() {
			w.units = prefix + spec.Ahead + unitsMark
		}
		ahead := 0
		for j, a := range keys[:i] {
			if acq[j] && strings.HasPrefix(a.Key, prefix+spec.Ahead) {
				ahead += w.ofMode(a.Key, a.Mode, a.ModRev, k.Created)
			}
		}
		served[i] = ahead < spec.slots()
	}
	return served
}

// Record writes value at key unless the key exists, and returns what the key holds then:
// value if this call or an earlier one wrote it, else what another writer recorded first.
// The writes also are made with it, in the same Txn. The key has no lease: it outlives
// every session. It writes nothing while the name holds a key of another use than the
// claim's: ErrOtherKind, naming it (a second Txn reads what). One Txn, retried through
// leader changes and tries that got no answer (CommitWrite: a retry of a put that was
// applied finds its own value).
func Record(ctx context.Context, cli *clientv3.Client, claim Claim, key, value string, also ...clientv3.Op) (stored string, err error) {
	if err := ctx.Err(); err != nil {
		return "", err // before any I/O: a try outlives ctx (see CommitWrite), and would write
	}
	guard := claim.Guard()
	txn := func() (*clientv3.TxnResponse, error) {
		res, err := CommitWrite(ctx, cli, func(t clientv3.Txn) clientv3.Txn {
			return t.If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, guard...)...).
				Then(append([]clientv3.Op{clientv3.OpPut(key, value)}, also...)...).
				Else(clientv3.OpGet(key))
		})
		if res.Resp == nil && err == nil {
			err = ctx.Err()
		}
		return res.Resp, err
	}
	resp, err := txn()
	if len(guard) > 0 && errors.Is(err, rpctypes.ErrPermissionDenied) {
		// A user granted its kind's sub-ranges alone: it cannot tell other kinds' keys.
		guard, claim = nil, Claim{}
		resp, err = txn()
	}
	switch {
	case err != nil:
		return "", fmt.Errorf("record %s: %w", key, err)
	case resp.Succeeded:
		return value, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // absent, so the claim's guard failed
		if err := Check(ctx, cli, claim); err != nil {
			return "", err
		}
		return "", fmt.Errorf("record %s: %w: the name's keys changed between a write and a read", key, ErrOtherKind)
	}
	return string(kvs[0].Value), nil
}

// The specs of the keys each primitive writes, the one statement of who each kind of key
// waits behind: the primitives acquire with them, and admin decides who holds by them
// (Served). value is what the key says (OwnerValue, or a candidate's value).

// SpecOfKey is the spec the key rest (relative to its name's prefix) with value was
// written with, for those who decide who holds without having written it (admin, by
// Served): the specs below, read back. limit is the name's semaphore limit, 0 when unknown.
// False for a key that is no holder's or waiter's (a record, a barrier's participant, a
// gate, a latch), and for a permit under an unknown limit, whose state cannot be told.
func SpecOfKey(rest, value string, limit int) (Spec, bool) {
	if u := UseOf(rest); IsRecord(rest) || u == UseBarrier || u == UseGate || u == UseLatch {
		return Spec{}, false
	}
	switch KindOf(rest) {
	case KindRead:
		return ReadSpec(""), true
	case KindWrite:
		if m := ModeOf(value); m == ModeUpgradable || m == ModeUpgrading {
			return UpgradableSpec(""), true
		}
		return WriteSpec(""), true
	case KindPermit:
		if limit < 1 {
			return Spec{}, false
		}
		return PermitSpec("", limit, max(KeyUnits(KindPermit, rest), 1)), true
	case KindParticipant:
		return Spec{}, false
	}
	return LockSpec(""), true
}

// LockSpec is a lock's key (mutex, reentrant, Multi): served once no key of the name is
// ahead of it.
func LockSpec(value string) Spec { return Spec{Value: value, Use: UseLock} }

// CandidateSpec is an election's candidate: a lock's key that a handover may be handed to.
func CandidateSpec(value string) Spec { return Spec{Value: value, Handover: true, Use: UseElection} }

// ReadSpec is a reader's: served once no write key is ahead of it but those of holds that
// are reads now (Downgrade) or upgradable reads.
func ReadSpec(value string) Spec {
	return Spec{Kind: KindRead, Ahead: KindWrite, Value: value, Passes: []string{ModeRead, ModeUpgradable}, Use: UseRWLock}
}

// UpgradableSpec is an upgradable read's: a write key in upgradable mode, served once no
// write key is ahead of it but those of holds that are reads now.
func UpgradableSpec(value string) Spec {
	return Spec{Kind: KindWrite, Ahead: KindWrite, Value: WithMode(value, ModeUpgradable), Passes: []string{ModeRead}, Use: UseRWLock}
}

// WriteSpec is a writer's: served once no key of the name is ahead of it.
func WriteSpec(value string) Spec { return Spec{Kind: KindWrite, Value: value, Use: UseRWLock} }

// PermitSpec is a semaphore's permit of units of limit: served once its units fit beside
// those of the permits ahead of it, under the limit in force (its marker).
func PermitSpec(value string, limit, units int) Spec {
	return Spec{Kind: KindPermit, Ahead: KindPermit, Capacity: limit, Weight: units, Value: value,
		CapacityMark: LimitMark, Use: UseSemaphore}
}
