package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Locker is one handle of the primitive under test. A worker uses its handle for one hold
// at a time: Lock, fenced writes under IsOwner, Unlock.
type Locker interface {
	// Lock waits for a hold until ctx ends.
	Lock(ctx context.Context) error
	// Unlock ends the hold. An error matching Workload.Lost says the hold was lost before;
	// any other error leaves it unknown whether it was released, and Unlock is called again.
	Unlock(ctx context.Context) error
	// Token is the fencing token of the current hold: the create revision of its key.
	Token() int64
	// IsOwner is a Txn compare that succeeds only while the current hold lasts.
	IsOwner() clientv3.Cmp
}

// Owners is what a Locker whose hold spans several names (a mutex.Multi) has besides
// IsOwner: a compare per name. The fenced writes of the run are then fenced on every one.
type Owners interface {
	Owners() []clientv3.Cmp
}

// ownerCmps are the compares that fence a write under lk's current hold.
func ownerCmps(lk Locker) []clientv3.Cmp {
	if o, ok := lk.(Owners); ok {
		return o.Owners()
	}
	return []clientv3.Cmp{lk.IsOwner()}
}

// Reader is a handle on the read side of a readers/writer lock. Unlike a Locker it is used
// by several workers at once, each with one read hold at a time: readers of one handle may
// share one key.
type Reader interface {
	// RLock waits for a read hold until ctx ends.
	RLock(ctx context.Context) error
	// RUnlock ends one read hold of the handle. An error matching Workload.Lost says the
	// hold was lost before; any other error leaves it unknown whether it was released, and
	// RUnlock is called again.
	RUnlock(ctx context.Context) error
}

// Workload is the primitive under test, as the harness drives it: "acquire an exclusive
// or slot hold, do fenced writes under it, release", and, for a readers/writer lock,
// "acquire a read hold, read, release" beside it.
type Workload struct {
	// Open returns a new handle on the lock called name, over cli, without I/O.
	Open func(cli *clientv3.Client, name string) (Locker, error)
	// Prefix is the key prefix under which the primitive keeps every key of name: it must
	// be empty once every worker has released.
	Prefix func(name string) string
	// TTL is the lease TTL the handles are opened with: the time a paused holder keeps
	// others waiting, part of every liveness bound.
	TTL time.Duration
	// Slots is how many may hold at once: 1 for a mutex (the default), n for a
	// semaphore(n); at most maxSlots. A hold whose Locker has a Units method (see Units)
	// takes that many of them.
	Slots int
	// HandsOver says that a hold may hand its key over to the next holder (an election's
	// transfer), who then holds with the same token: the model takes an acquire of the
	// highest token granted, held by nobody any more, as such a handover.
	HandsOver bool
	// KeyUnits, if set, says how many slots the hold of a key under Prefix takes; nil counts
	// one for every key. The compaction fault reads it to tell when someone waits.
	KeyUnits func(key string) int
	// Observe, if set, starts an observer of the lock called name over cli (an election's
	// Observe, say) that runs until ctx ends, and returns its check: called once every
	// worker has released, it must return nil once the observer has come to see that
	// nobody holds, having seen the holders' tokens only ever increase, and an error if
	// ctx ends first or the observer saw them out of order. RunFault starts one observer
	// on a client spread over the members, member i first, for each member i, before the
	// warm-up, and gives their checks the serve bound.
	Observe func(ctx context.Context, cli *clientv3.Client, name string) (converged func(ctx context.Context) error)
	// Partners, if set, are the other names a hold of name takes (a mutex.Multi's), whose
	// prefixes (Prefix of each) must be empty too once every worker has released. The
	// faults strike the keys under Prefix(name) alone.
	Partners func(name string) []string
	// Seed picks the one fixed seed Explore runs in CI (see ciSeeds; 0 runs the last).
	Seed uint64
	// Lost is the error Unlock and RUnlock return, wrapped, for a hold that was lost.
	Lost error
	// OpenReader, if set, returns a new handle on the read side of the lock called name,
	// over cli, without I/O; it must be safe for concurrent use. The run then adds reader
	// workers, several per handle, and checks that no read hold overlaps a write hold
	// (Open's) and that readers too are served after each fault. It needs one slot.
	OpenReader func(cli *clientv3.Client, name string) (Reader, error)
	// Disturb, if set, is a disturbance of the primitive's own (a semaphore's limit lowered
	// for a while) that Explore draws among its faults, over the admin client, on the lock
	// called name. It must leave Slots as it found it before it returns, and never let more
	// than Slots hold meanwhile; it says what it did.
	Disturb func(ctx context.Context, cli *clientv3.Client, name string, rng *rand.Rand) (string, error)
}

func (w Workload) slots() int { return max(w.Slots, 1) }

// partnerPrefixes are the prefixes of the other names a hold of name takes.
func (w Workload) partnerPrefixes(name string) []string {
	if w.Partners == nil {
		return nil
	}
	var prefixes []string
	for _, p := range w.Partners(name) {
		prefixes = append(prefixes, w.Prefix(p))
	}
	return prefixes
}

// Units is what a Locker may also have when a hold takes several slots: a weighted
// semaphore's permit of n units. It says how many the current hold takes.
type Units interface {
	Units() int
}

// unitsOf is how many slots lk's current hold takes: 1 unless it says otherwise.
func unitsOf(lk Locker) int {
	if u, ok := lk.(Units); ok {
		return max(u.Units(), 1)
	}
	return 1
}

// keyUnits is how many slots the hold of key takes.
func (w Workload) keyUnits(key string) int {
	if w.KeyUnits == nil {
		return 1
	}
	return w.KeyUnits(key)
}

func (w Workload) validate() error {
	switch {
	case w.Open == nil || w.Prefix == nil || w.Lost == nil:
		return fmt.Errorf("faulttest: Workload needs Open, Prefix and Lost")
	case w.TTL < time.Second:
		return fmt.Errorf("faulttest: Workload.TTL %v, below etcd's 1 s minimum", w.TTL)
	case w.slots() > maxSlots:
		return fmt.Errorf("faulttest: Workload.Slots %d, more than %d", w.Slots, maxSlots)
	case w.OpenReader != nil && w.slots() > 1:
		return fmt.Errorf("faulttest: Workload.OpenReader needs one slot, not %d: readers exclude a single writer", w.Slots)
	}
	return nil
}

// serveBound is how long after a fault heals some waiter must be served: a holder cut off
// by the fault keeps the others waiting for its lease's TTL, the cluster may need an
// election, and a 2-core machine running the race detector is slow.
func (w Workload) serveBound() time.Duration { return w.TTL + 15*time.Second }
