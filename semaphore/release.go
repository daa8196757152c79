package semaphore

// WatchRelease lets a caller that retries a failed TryAcquire wake when a permit may have
// come free instead of sleeping blindly; package trylock's Permits adapter uses it. Call
// arm before each TryAcquire: its channel yields once a permit key of the name is deleted
// after that (a Release, a waiter giving up, a lost lease), or when the watch cannot tell
// whether one was, so a wake may be spurious. Call stop once done, from any goroutine; arm
// is for one goroutine at a time. It shares the client's one watch of the name and sends
// no RPC of its own.
func (s *Semaphore) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	return s.q.WatchRelease(permitKind)
}
