package core

import (
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
}

// NewQueue returns the queue of the name whose key prefix is prefix. It does no I/O.
func NewQueue(cli *clientv3.Client, sessions Sessions, prefix string) *Queue {
	return &Queue{cli: cli, sessions: sessions, prefix: prefix}
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
// units.go) and the threshold a waiter is served at.
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
	// it fails, the acquisition writes nothing and returns ErrGuard (see try.go).
	Guard []clientv3.Cmp
}

func (s Spec) capacity() int { return max(s.Capacity, 1) }

func (s Spec) weight() int { return max(s.Weight, 1) }

// slots is the threshold of the spec: it is served once what is ahead weighs less.
func (s Spec) slots() int { return s.capacity() - s.weight() + 1 }

// weighted reports whether the keys ahead may weigh more than one unit each.
func (s Spec) weighted() bool { return s.capacity() > 1 }

// keyKind is the sub-prefix the acquisition's key goes under: Kind, with its weight when
// above one (see unitsKind).
func (s Spec) keyKind() string { return unitsKind(s.Kind, s.weight()) }

