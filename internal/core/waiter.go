package core

import (
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A queueWaiter is one queued acquisition as its hub sees it: how many keys are ahead of it
// (or how many units, when keys have weights), as of which revision. Keys created later are
// behind it, so that number only falls: by a key's weight for each delete, after the
// snapshot, of a key created before the waiter's own. A delete's
// create revision comes with the event (its previous value), so a waiter needs no list of
// the keys ahead, only their number.
//
// Its fields are guarded by the hub's mutex; wake tells the waiting goroutine to look.
type queueWaiter struct {
	key    string  // its own key
	rev    int64   // its key's create revision: its place in line
	prefix string  // where the keys that count against it live (the name prefix + Spec.Ahead)
	slots  int     // it is served once fewer than slots keys are ahead
	weigh  weigher // with units: what each key ahead weighs, counted instead of keys
	wake   chan struct{}

	snap  int64 // the revision its count reflects
	ahead int   // keys in prefix created before rev and alive at snap
	state waitState
	err   error // its key went (or the name could not be read): the wait is over, unserved
}

type waitState int

const (
	counting  waitState = iota // the deletes it is dispatched keep its count
	rereading                  // the events cannot keep its count: the hub reads the name
	served                     // fewer than slots keys are ahead
)

func newQueueWaiter(key string, rev, snap int64, ahead int, prefix string, slots int) *queueWaiter {
	w := &queueWaiter{key: key, rev: rev, prefix: prefix, slots: slots, wake: make(chan struct{}, 1), snap: snap, ahead: ahead}
	if ahead < slots {
		w.state = served
	}
	return w
}

func (w *queueWaiter) since() int64 { return w.snap }

func (w *queueWaiter) stale() bool { return w.state == rereading && w.err == nil }

// apply counts the deletes of one revision. Its own key's delete is a loss whatever else
// went at the same revision (a lease that ends takes a client's holder and its waiters
// together): the waiter is not served on a key that is already gone. A waiter that is
// re-reading still heeds its own key's delete, which needs no count.
func (w *queueWaiter) apply(_ int64, evs []event) {
	if w.err != nil {
		return
	}
	gone, unknown := 0, false
	for _, e := range evs {
		switch {
		case e.put:
		case e.key == w.key:
			w.fail(fmt.Errorf("%w: key %s deleted while waiting", ErrLost, w.key))
			return
		case !strings.HasPrefix(e.key, w.prefix):
		case e.created == 0:
			unknown = true // etcd could not say when the key was created
		case e.created < w.rev:
			gone += w.weigh.of(e.key)
		}
	}
	switch {
	case w.state != counting:
	case unknown:
		w.state = rereading
	default:
		w.ahead -= gone
		if w.ahead < w.slots {
			w.state = served
			signal(w.wake)
		}
	}
}

// missed has the waiter's count read again, unless it is served already.
func (w *queueWaiter) missed() {
	if w.state == counting {
		w.state = rereading
	}
}

func (w *queueWaiter) fail(err error) {
	if w.err == nil {
		w.err = err
		signal(w.wake)
	}
}

// recount renews a stale count from kvs, every key of the name read at revision rev. A read
// older than the waiter's snapshot cannot: the waiter stays stale for the next read.
func (w *queueWaiter) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !w.stale() || rev < w.snap {
		return
	}
	own, n := false, 0
	for _, kv := range kvs {
		k := string(kv.Key)
		switch {
		case k == w.key:
			own = kv.CreateRevision == w.rev
		case strings.HasPrefix(k, w.prefix) && kv.CreateRevision < w.rev:
			n += w.weigh.of(k)
		}
	}
	if !own {
		w.fail(fmt.Errorf("%w: key %s deleted while waiting", ErrLost, w.key))
		return
	}
	w.snap, w.ahead, w.state = rev, n, counting
	if n < w.slots {
		w.state = served
		signal(w.wake)
	}
}

// outcome is how the wait ended: served (nil), failed (its error), or not yet (done false).
// The error comes first: a waiter whose key went is not served, even if it was counted
// served a moment before.
func (w *queueWaiter) outcome() (done bool, err error) {
	switch {
	case w.err != nil:
		return true, w.err
	case w.state == served:
		return true, nil
	}
	return false, nil
}
