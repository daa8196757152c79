package core

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// What a name is used as. Each use owns sub-ranges of the name's prefix (its keys and its
// records; etcd's own concurrency and recipes put theirs in the same places), and a write of
// one use compares, in its Txn, that no key lies under the name outside the ranges it owns
// (Claim.Guard). So a lock never waits behind a semaphore's limit record, which has no lease
// and would stay ahead of every new key for good, nor behind another use's keys: it fails
// at once, having written nothing, with ErrOtherKind naming what it found. The guard is
// compares only: it costs no op and no read while the name is used one way.
//
// A lock's keys (mutex, reentrant, Multi, etcd's Mutex and `etcdctl lock`) are
// "<lease hex>[_<slot>]", which start with a digit or a..f; every other use's sub-ranges
// start with a letter after f, so a lock owns everything below "g".

// Use is what a name is used as.
type Use uint8

const (
	UseLock      Use = iota + 1 // mutex, reentrant, mutex.Multi; etcd's Mutex
	UseElection                 // election; etcd's Election
	UseRWLock                   // rwmutex; etcd's recipe.RWMutex
	UseSemaphore                // semaphore
	UseBarrier                  // barrier's double barrier
	UseGate                     // barrier.Gate
	UseLatch                    // latch
)

var useNames = [...]string{UseLock: "lock", UseElection: "election", UseRWLock: "rwlock",
	UseSemaphore: "semaphore", UseBarrier: "barrier", UseGate: "gate", UseLatch: "latch"}

func (u Use) String() string {
	if int(u) < len(useNames) && useNames[u] != "" {
		return useNames[u]
	}
	return "unknown"
}

// span is a sub-range of a name's prefix, [from, to) relative to it; to "" is the end of
// the prefix's range.
type span struct{ from, to string }

// ownedBy are the sub-ranges each use owns.
var ownedBy = map[Use][]span{
	UseLock:      {{"", "g"}},
	UseElection:  {{"", "g"}, {"p0", "p:"}}, // and its candidates with a preference, "p<n>/"
	UseRWLock:    {{KindRead, "read0"}, {KindWrite, "write0"}},
	UseSemaphore: {{RecordLimit, "limit0"}, {KindPermit, "permit0"}}, // its record, markers, permits
	UseBarrier:   {{kindIn, "in0"}, {roundRecord, roundRecord + "\x00"}, {sizeRecord, sizeRecord + "\x00"}},
	UseGate:      {{gateKey, gateKey + "\x00"}},
	UseLatch:     {{latchKey, "latch0"}}, // its record and markers, "latch/<participant>"
}

// foreign are the sub-ranges of a name that u does not own, in key order.
func (u Use) foreign() []span {
	var out []span
	at := ""
	for _, s := range ownedBy[u] {
		if s.from > at {
			out = append(out, span{at, s.from})
		}
		at = s.to
	}
	return append(out, span{at, ""})
}

// UseOf is the use that owns rest, a key relative to its name's prefix; 0 for none. A
// lock's keys are told as a lock's (an election's candidates are laid out alike).
func UseOf(rest string) Use {
	for _, u := range []Use{UseLock, UseRWLock, UseSemaphore, UseBarrier, UseGate, UseLatch, UseElection} {
		for _, s := range ownedBy[u] {
			if rest >= s.from && (s.to == "" || rest < s.to) {
				return u
			}
		}
	}
	return 0
}

// ErrOtherKind: the name holds keys or records of another kind of primitive (a
// semaphore's limit under a name now locked, say), which a waiter of this kind would count
// ahead of it; nothing was written. The error names what was found.
var ErrOtherKind = errors.New("etcdsync: the name is used by another kind of primitive")

// A Claim is a use of the name whose keys lie under Prefix.
type Claim struct {
	Prefix string
	Use    Use
}

// Guard are the compares that hold while no key lies under the name outside what the
// claim's use owns; none for a claim without a use.
func (c Claim) Guard() []clientv3.Cmp {
	if c.Use == 0 {
		return nil
	}
	f := c.Use.foreign()
	cmps := make([]clientv3.Cmp, len(f))
	for i, s := range f {
		end := clientv3.GetPrefixRangeEnd(c.Prefix)
		if s.to != "" {
			end = c.Prefix + s.to
		}
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(c.Prefix+s.from), "=", 0).WithRange(end)
	}
	return cmps
}

// probes read, keys only, the first key of each sub-range the claim's use does not own.
func (c Claim) probes() []clientv3.Op {
	var ops []clientv3.Op
	for _, s := range c.Use.foreign() {
		end := clientv3.GetPrefixRangeEnd(c.Prefix)
		if s.to != "" {
			end = c.Prefix + s.to
		}
		ops = append(ops, clientv3.OpGet(c.Prefix+s.from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1)))
	}
	return ops
}

// Check reads the name's sub-ranges that the claims' uses do not own, and returns
// ErrOtherKind naming the first key found there; nil if there is none, or the read failed
// (the caller's own error then stands). For a write whose guard failed: was it this? One
// Range per sub-range, in one Txn.
func Check(ctx context.Context, cli *clientv3.Client, claims ...Claim) error {
	var ops []clientv3.Op
	for _, c := range claims {
		ops = append(ops, c.probes()...)
	}
	if len(ops) == 0 {
		return nil
	}
	resp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
	})
	if err != nil {
		return nil
	}
	i := 0
	for _, c := range claims {
		for range c.Use.foreign() {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
				return c.otherKind(string(kvs[0].Key))
			}
			i++
		}
	}
	return nil
}

// foreign reports whether key, under the claim's name, is not of the claim's use.
func (c Claim) foreign(key string) bool {
	rest := strings.TrimPrefix(key, c.Prefix)
	for _, s := range ownedBy[c.Use] {
		if rest >= s.from && (s.to == "" || rest < s.to) {
			return false
		}
	}
	return true
}

// otherKind is ErrOtherKind for key, found under the claim's name.
func (c Claim) otherKind(key string) error {
	what := "a key of no primitive's"
	if u := UseOf(strings.TrimPrefix(key, c.Prefix)); u != 0 {
		what = "a key of a " + u.String()
	}
	return fmt.Errorf("%w: %s holds %s, %s, not of a %s: use another name, or once nobody uses it "+
		"remove its lasting records with `etcdsync delete` (admin.Delete)", ErrOtherKind,
		strings.TrimSuffix(c.Prefix, "/"), what, key, c.Use)
}

// The specs of the keys each primitive writes, the one statement of who each kind of key
// waits behind: the primitives acquire with them, and admin decides who holds by them
// (Served). value is what the key says (OwnerValue, or a candidate's value).

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
