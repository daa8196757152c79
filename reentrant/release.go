package reentrant

import "github.com/etcdsync/etcdsync/internal/core"

// WatchRelease lets a caller that retries a failed TryLock wake when the lock may have come
// free instead of sleeping blindly; trylock's Retry and Timeout use it. Call arm before each
// TryLock: its channel yields once a key of the name is deleted after that (a last Unlock, a
// waiter giving up, a lost lease), or when the watch cannot tell whether one was, so a wake
// may be spurious. Call stop once done, from any goroutine; arm is for one goroutine at a
// time. On a Mutex not made by [New], arm's channel never yields.
//
// Cost: none of its own. It shares the client's one watch of the name with every waiter
// there (the first registration on a client opens it); neither it nor arm ever blocks.
func (m *Mutex) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if m.queue() == nil {
		return core.NoReleases()
	}
	return m.q.WatchRelease("")
}
