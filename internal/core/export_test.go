package core

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Transient is transient, for the tests of package core_test.
var Transient = transient

// Enqueued is Telemetry.enqueued, for the allocation test.
func (t *Telemetry) Enqueued(ctx context.Context, ahead int, rev int64) { t.enqueued(ctx, ahead, rev) }

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

// ClockSees records an answer with header h in a new clock's history, one after the other,
// and returns what linear said of each.
func ClockSees(headers ...*pb.ResponseHeader) []error {
	var c clock
	errs := make([]error, len(headers))
	for i, h := range headers {
		errs[i] = c.linear(h, 0)
	}
	return errs
}

// NearAhead is how many keys may be ahead of a waiter for it to join its client's hub at
// once; LingerDeletes how many revisions with deletes an idle hub hears before it closes.
func NearAhead() int { return int(nearAhead.Load()) }

func LingerDeletes() int { return lingerDeletes() }

// HasHub reports whether cli has a watch of the name (open or lingering) for its waiters.
func HasHub(cli *clientv3.Client, name string) bool {
	return hasHub(hubKey{cli: cli, prefix: NamePrefix(name), mode: deletesOnly})
}
