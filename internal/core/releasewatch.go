package core

import (
	"math"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A ReleaseWatch tells a caller that retries a failed try when a key of the name has been
// deleted: a holder or a waiter let go, so the next try may succeed. It is a registration
// with the client's watch on the name, like a waiter's, and sends no RPC of its own.
//
// It is armed before each try and then waited on: Arm counts from every delete the watch
// has dispatched, which is never ahead of the revision at which the try that follows runs,
// so a release between the try and the wait is not missed. A delete the try already saw may
// wake it too; so may a watch that cannot tell what it missed (it just started, or etcd
// compacted its history): a spurious wake costs one more try, never a lost one.
//
// It is for one goroutine at a time. Registering never blocks: the watch is opened by the
// hub's own goroutine.
type ReleaseWatch struct {
	h    *hub
	w    *releaseWatch
	once sync.Once
}

// WatchReleases registers a release watch for the deletes of keys in the sub-range kind of
// the name ("" for every kind). It is disarmed until Arm. Stop it when done.
func (q *Queue) WatchReleases(kind string) *ReleaseWatch {
	w := &releaseWatch{prefix: q.prefix + kind, wake: make(chan struct{}, 1)}
	return &ReleaseWatch{h: join(q.hubKey(), w), w: w}
}

// WatchRelease is WatchReleases in the shape of package trylock's ReleaseWatcher: arm is
// Arm, stop is Stop.
func (q *Queue) WatchRelease(kind string) (arm func() <-chan struct{}, stop func()) {
	r := q.WatchReleases(kind)
	return r.Arm, r.Stop
}

// Arm starts a new round: the returned channel yields once a key of the watch's kind is
// deleted at a revision after every delete dispatched so far (or when the watch cannot tell,
// see ReleaseWatch). It forgets the rounds before; the channel is the same every round and
// yields at most once per round.
func (r *ReleaseWatch) Arm() <-chan struct{} {
	h, w := r.h, r.w
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-w.wake:
	default:
	}
	// 0 before the watch has started: its start then counts as a release (catchUp), since
	// it may start after the try and so after a release that the try did not see.
	w.armed, w.snap = true, h.dispatched()
	return w.wake
}

// Stop ends the registration; only the first call counts.
func (r *ReleaseWatch) Stop() { r.once.Do(func() { r.h.leave(r.w) }) }

// releaseWatch is a ReleaseWatch as its hub sees it. Its fields are guarded by the hub's
// mutex.
type releaseWatch struct {
	prefix string
	wake   chan struct{}
	armed  bool
	snap   int64
}

// since is the armed round's start; a disarmed watch wants no event, and no replay.
func (w *releaseWatch) since() int64 {
	if !w.armed {
		return math.MaxInt64
	}
	return w.snap
}

func (w *releaseWatch) apply(_ int64, evs []event) {
	for _, e := range evs {
		if !e.put && strings.HasPrefix(e.key, w.prefix) {
			w.fire()
			return
		}
	}
}

// missed counts as a release: the watch cannot know whether one went by.
func (w *releaseWatch) missed() { w.fire() }

func (w *releaseWatch) stale() bool { return false }

func (w *releaseWatch) recount([]*mvccpb.KeyValue, int64) {}

// fail wakes the caller, whose next try then meets what failed.
func (w *releaseWatch) fail(error) { w.fire() }

func (w *releaseWatch) fire() {
	if w.armed {
		w.armed = false
		signal(w.wake)
	}
}
