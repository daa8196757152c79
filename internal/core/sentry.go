package core

import "sync"

// A Sentry tells a hold whether a key of some kind has queued behind it since it was
// granted: a reader that lets more readers share its hold stops doing so once a writer
// waits, so that writers never starve. It is a registration with the client's watch on the
// name (the queue must watch arrivals, see Queue.WatchArrivals) and sends no RPC of its
// own, except one read when it registers after the events it needs have left the watch's
// memory.
type Sentry struct {
	h    *hub
	w    *waiter
	once sync.Once
}

// WatchBehind starts a sentry for hold, a hold of q, watching for keys created after it in
// the sub-range kind of the name ("" for every kind). Stop it before the hold is released.
func (q *Queue) WatchBehind(hold *Hold, kind string) *Sentry {
	if !q.arrivals {
		panic("core: WatchBehind on a queue that does not watch arrivals")
	}
	w := newSentry(hold.key, hold.rev, q.prefix+kind)
	return &Sentry{h: join(q.hubKey(), w), w: w}
}

// Behind reports whether a key of the sentry's kind was created after the hold, or the
// hold's key is gone. Until the watch has caught up with the hold's revision (a read after
// a compaction, say) it reports what it knows: false.
func (s *Sentry) Behind() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.w.served || s.w.err != nil
}

// Stop ends the registration; only the first call counts. The last registration to leave
// a hub stops its goroutine before Stop returns.
func (s *Sentry) Stop() { s.once.Do(func() { s.h.leave(s.w) }) }
