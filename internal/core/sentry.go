package core

import (
	"fmt"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A Sentry tells a hold whether a key of some kind has queued behind it since it was
// granted: a reader that lets more readers share its hold stops doing so once a writer
// waits, so that writers never starve. It is a registration with the client's watch on the
// name (the queue must watch arrivals, see Queue.WatchArrivals) and sends no RPC of its
// own, except one read when it registers after the events it needs have left the watch's
// memory.
type Sentry struct {
	h    *hub
	s    *sentry
	once sync.Once
}

// WatchBehind starts a sentry for hold, a hold of q, watching for keys created after it in
// the sub-range kind of the name ("" for every kind). Stop it before the hold is released.
func (q *Queue) WatchBehind(hold *Hold, kind string) *Sentry {
	if !q.arrivals {
		panic("core: WatchBehind on a queue that does not watch arrivals")
	}
	s := &sentry{key: hold.key, rev: hold.rev, prefix: q.prefix + kind, snap: hold.rev}
	return &Sentry{h: join(q.hubKey(), s), s: s}
}

// Behind reports whether a key of the sentry's kind was created after the hold, or the
// hold's key is gone. Until the watch has caught up with the hold's revision (a read after
// a compaction, say) it reports what it knows: false.
func (s *Sentry) Behind() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.s.behind || s.s.err != nil
}

// Lost reports whether the hold's key was seen to go: the hold is lost.
func (s *Sentry) Lost() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.s.err != nil
}

// Stop ends the registration; only the first call counts.
func (s *Sentry) Stop() { s.once.Do(func() { s.h.leave(s.s) }) }

// sentry is a Sentry as its hub sees it. Its fields are guarded by the hub's mutex.
type sentry struct {
	key    string // the hold's key
	rev    int64  // the hold's create revision
	prefix string // where the keys it looks out for live
	snap   int64  // the revision its view reflects

	behind    bool  // a key in prefix was created after rev
	rereading bool  // the events cannot tell: the hub reads the name
	err       error // the hold's key went
}

func (s *sentry) since() int64 { return s.snap }

func (s *sentry) stale() bool { return s.rereading && !s.behind && s.err == nil }

func (s *sentry) apply(_ int64, evs []event) {
	for _, e := range evs {
		switch {
		case !e.put && e.key == s.key:
			s.fail(fmt.Errorf("%w: key %s deleted", ErrLost, s.key))
		case e.put && e.created > s.rev && strings.HasPrefix(e.key, s.prefix):
			s.behind = true
		}
	}
}

func (s *sentry) missed() { s.rereading = true }

func (s *sentry) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

func (s *sentry) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !s.stale() || rev < s.snap {
		return
	}
	own := false
	for _, kv := range kvs {
		k := string(kv.Key)
		switch {
		case k == s.key:
			own = kv.CreateRevision == s.rev
		case strings.HasPrefix(k, s.prefix) && kv.CreateRevision > s.rev:
			s.behind = true
		}
	}
	if !own {
		s.fail(fmt.Errorf("%w: key %s deleted", ErrLost, s.key))
	}
	s.snap, s.rereading = rev, false
}
