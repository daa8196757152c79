package semaphore

import "github.com/etcdsync/etcdsync/internal/core"

// WatchRelease lets a caller that retries a failed TryAcquire wake when a permit may have
// come free instead of sleeping blindly; package trylock's Permits adapter uses it. Call
// arm before each TryAcquire: its channel yields once a permit key of the name is deleted
// after that (a Release, a waiter giving up, a lost lease), or when the watch cannot tell
// whether one was, so a wake may be spurious. Call stop once done, from any goroutine; arm
// is for one goroutine at a time. It shares the client's one watch of the name and sends
// no RPC of its own; neither it nor arm ever blocks. On a Semaphore not made by New, arm's
// channel never yields.
func (s *Semaphore) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if s.queue() == nil {
		return core.NoReleases()
	}
	return s.q.WatchRelease(permitKind)
}
