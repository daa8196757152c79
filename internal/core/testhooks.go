package core

import clientv3 "go.etcd.io/etcd/client/v3"

// Hooks for the tests in internal/testkit, which live in a module of their own (so that
// the library requires nothing they need) and so cannot use an export_test.go here. None
// of them is called by the library.

// Transient reports whether err is one that a retry may get past (see retry).
func Transient(err error) bool { return transient(err) }

// StopKeepAlive stops the keep-alive of h's session without ending or revoking anything, as
// a keep-alive that returned by mistake would.
func StopKeepAlive(h *Hold) { h.sess.ka.stop() }

// StopMonitor stops the watch of h's key without ending the hold, as a goroutine of the
// client's keyWatch (or h's monitor, on a wrapped client) that returned by mistake would.
func StopMonitor(h *Hold) {
	h.mu.Lock()
	m := h.mon
	h.mu.Unlock()
	if m != nil {
		m.stop()
		h.waitMonitor()
		return
	}
	stateOf(h.cli).keys.crash()
}

// NearAhead is how many keys may be ahead of a waiter for it to join its client's hub at
// once (see SetNearAhead).
func NearAhead() int { return int(nearAhead.Load()) }

// LingerDeletes is how many revisions with deletes an idle hub hears before it closes.
func LingerDeletes() int { return lingerDeletes() }

// HasHub reports whether cli has a watch of the name (open or lingering) for its waiters.
func HasHub(cli *clientv3.Client, name string) bool {
	k := hubKey{cli: cli, prefix: NamePrefix(name), mode: deletesOnly}
	if hasHub(k) {
		return true
	}
	k.mode = arrivals // an rwmutex's
	return hasHub(k)
}

// SetMaxLeaseKeys sets how many keys a shared lease carries before the next acquisition
// takes a new one, and returns what restores it; not for use beside other tests.
func SetMaxLeaseKeys(n int) (restore func()) {
	old := maxLeaseKeys.Swap(int64(n))
	return func() { maxLeaseKeys.Store(old) }
}
