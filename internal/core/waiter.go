package core

import (
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
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

	seen    int64      // the revision its count reflects
	ahead   int        // keys in prefix created before rev and alive at seen
	served  bool       // ahead < slots; for a sentry: a key arrived behind
	behind  bool       // a sentry: it watches for keys in prefix created after rev (see Sentry)
	release bool       // a release watch: served by any delete in prefix after seen (see ReleaseWatch)
	err     error      // its key went: the wait is over, unserved
	stale   bool       // the events cannot keep its count: the hub reads it again
	obs     *headState // an observer: it tracks the name's live keys (see Observer)
}

func newWaiter(key string, rev, seen int64, ahead int, prefix string, slots int) *waiter {
	return &waiter{key: key, rev: rev, prefix: prefix, slots: slots, wake: make(chan struct{}, 1), seen: seen, ahead: ahead, served: ahead < slots}
}

// newReleaseWatch returns the waiter of a release watch on prefix, disarmed (served) until
// ReleaseWatch.Arm gives it a revision to count from.
func newReleaseWatch(prefix string) *waiter {
	return &waiter{prefix: prefix, slots: 1, wake: make(chan struct{}, 1), served: true, release: true}
}

// newSentry returns the waiter of a sentry for the hold of key at rev: it counts nothing
// ahead, and is "served" once a key in prefix created after rev arrives.
func newSentry(key string, rev int64, prefix string) *waiter {
	return &waiter{key: key, rev: rev, prefix: prefix, slots: 1, wake: make(chan struct{}, 1), seen: rev, behind: true}
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
// key that was created again before the snapshot. A stale waiter ignores every delete: the
// read that will renew its count comes after it.
//
// A sentry counts arrivals instead: a new key in its prefix created after its own. A release
// watch is served by the first delete of any key in its prefix.
func (w *waiter) apply(e event) {
	switch {
	case w.served || w.err != nil || w.stale:
	case e.rev <= w.seen:
	case w.obs != nil:
		w.seen = e.rev // a later read older than this would take the view back in time
		if e.put {
			w.obs.put(e.key, e.created, e.value)
		} else {
			w.obs.remove(e.key)
		}
		if w.obs.update() {
			w.signal()
		}
	case w.release:
		if !e.put && strings.HasPrefix(e.key, w.prefix) {
			w.served = true
			w.signal()
		}
	case e.put:
		if w.behind && e.created > w.rev && strings.HasPrefix(e.key, w.prefix) {
			w.served = true
			w.signal()
		}
	case e.key == w.key:
		w.fail(fmt.Errorf("%w: key %s deleted while waiting", ErrLost, w.key))
	case w.behind: // other deletes do not concern a sentry
	case e.created == 0:
		w.stale = true // etcd could not say when the key was created
	case e.created < w.rev && strings.HasPrefix(e.key, w.prefix):
		w.ahead--
		w.served = w.ahead < w.slots
		if w.served {
			w.signal()
		}
	}
}

// missed says that the events can no longer tell what happened since seen: a waiter or a
// sentry has its count read again (stale); a release watch cannot know whether a release
// went by, so it takes it that one did (a spurious wake costs its owner one more try).
func (w *waiter) missed() {
	if !w.release {
		w.stale = true
		return
	}
	if !w.served && w.err == nil {
		w.served = true
		w.signal()
	}
}

func (w *waiter) fail(err error) {
	if w.err == nil && !w.served {
		w.err = err
		w.signal()
	}
}

// recount renews a stale count from kvs, every key of the name read at revision rev. A read
// older than the waiter's snapshot cannot: the waiter stays stale for the next read.
func (w *waiter) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !w.stale || w.served || w.err != nil || rev < w.seen {
		return
	}
	w.stale = false
	if w.obs != nil {
		w.seen = rev
		w.obs.reset(kvs)
		if w.obs.update() {
			w.signal()
		}
		return
	}
	own, n := false, 0
	for _, kv := range kvs {
		k := string(kv.Key)
		switch {
		case k == w.key:
			own = kv.CreateRevision == w.rev
		case !strings.HasPrefix(k, w.prefix):
		case w.behind && kv.CreateRevision > w.rev, !w.behind && kv.CreateRevision < w.rev:
			n++
		}
	}
	if !own {
		w.fail(fmt.Errorf("%w: key %s deleted while waiting", ErrLost, w.key))
		return
	}
	if w.behind {
		w.seen, w.served = rev, n > 0
		if w.served {
			w.signal()
		}
		return
	}
	w.seen, w.ahead, w.served = rev, n, n < w.slots
	if w.served {
		w.signal()
	}
}
