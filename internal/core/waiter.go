package core

import (
	"fmt"
	"strings"
)

// A waiter is one queued acquisition as its hub sees it: how many keys are ahead of it, as
// of which revision. Keys created later are behind it, so that number only falls: by one
// for each delete, after the snapshot, of a key created before the waiter's own. A delete's
// create revision comes with the event (its previous value), so a waiter needs no list of
// the keys ahead, only their number.
//
// Its fields are guarded by the hub's mutex; wake tells the waiting goroutine to look.
type waiter struct {
	key    string // its own key
	rev    int64  // its key's create revision: its place in line
	prefix string // where the keys that count against it live (the name prefix + Spec.Ahead)
	slots  int    // it is served once fewer than slots keys are ahead
	wake   chan struct{}

	seen       int64   // the revision its count reflects
	ahead      int     // keys in prefix created before rev and alive at seen
	served     bool    // ahead < slots
	err        error   // its key went: the wait is over, unserved
	needResync bool    // the count cannot be kept from events: read it again
	resyncing  bool    // a read is under way; events meanwhile go to buffer
	buffer     []event //
}

func newWaiter(key string, rev, seen int64, ahead int, prefix string, slots int) *waiter {
	w := &waiter{key: key, rev: rev, prefix: prefix, slots: slots, wake: make(chan struct{}, 1), seen: seen, ahead: ahead}
	w.served = ahead < slots
	return w
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// apply counts one delete. A delete at or below seen is reflected already: a member that
// applies behind the one that answered the waiter's Txn replays such deletes, among them
// those of an earlier incarnation of the waiter's own (reused) key, or of a predecessor's
// key that was created again before the snapshot.
func (w *waiter) apply(e event) {
	switch {
	case w.served || w.err != nil:
	case w.resyncing:
		w.buffer = append(w.buffer, e)
	case e.rev <= w.seen:
	case e.key == w.key:
		w.fail(fmt.Errorf("%w: key %s deleted while waiting", ErrLost, w.key))
	case e.created == 0:
		w.resync() // etcd could not say when the key was created
	case e.created < w.rev && strings.HasPrefix(e.key, w.prefix):
		w.ahead--
		if w.ahead < w.slots {
			w.served = true
			w.signal()
		}
	}
}

func (w *waiter) fail(err error) {
	if w.err == nil && !w.served {
		w.err = err
		w.signal()
	}
}

// resync asks the waiting goroutine to read the count again.
func (w *waiter) resync() {
	w.needResync = true
	w.signal()
}

// beginResync marks a read under way: from now on events are kept until it ends.
func (w *waiter) beginResync() {
	w.needResync, w.resyncing, w.buffer = false, true, w.buffer[:0]
}

// endResync installs the count read at revision seen, then applies what came meanwhile.
func (w *waiter) endResync(seen int64, ahead int) {
	buffered := w.buffer
	w.resyncing, w.buffer = false, nil
	if seen >= w.seen {
		w.seen, w.ahead = seen, ahead
		w.served = ahead < w.slots
	}
	for _, e := range buffered {
		w.apply(e)
	}
	w.signal()
}

// abortResync gives up a read that failed; the events kept are applied to the old count.
func (w *waiter) abortResync() {
	w.needResync = true
	w.endResync(0, 0)
}
