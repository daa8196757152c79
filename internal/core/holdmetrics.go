package core

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// holdMetrics is what a counted hold needs to record its end. A pointer in Hold, so that a
// hold nobody counts is no bigger.
type holdMetrics struct {
	t        *Telemetry
	granted  time.Time
	counted  bool // among the holds (a view may drop that instrument and keep the others)
	recorded bool // its end is recorded
	// unsettled: lost with its key gone while its session lived, so only etcd can say
	// whether the lease went (revoked) or the key alone (deleted); see settleLoss.
	unsettled bool
	// settled is closed once the loss is counted, by whichever call of settleLoss took it:
	// a Release waits for one the keyWatch runs, so that the loss is counted when it returns.
	settled chan struct{}
}

// Held counts h among t's holds until it ends, and then records how long it lasted and,
// for a loss, why. Call it once the hold is granted. It does nothing for no hold (nil), or
// when nothing records t's hold instruments.
func (t *Telemetry) Held(h *Hold) {
	if t == nil || h == nil {
		return
	}
	bg := context.Background()
	counted := t.ins.holds.Enabled(bg)
	if !counted && !t.ins.hold.Enabled(bg) && !t.ins.lost.Enabled(bg) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.metrics != nil {
		return
	}
	if counted {
		t.ins.holds.Add(bg, 1, t.plain...)
	}
	h.metrics = &holdMetrics{t: t, granted: time.Now(), counted: counted}
	if h.state == lost || h.state == over {
		h.recordEnd(h.err)
	}
}

// recordEnd records the end of a counted hold, with its final error (see holdMetrics.end).
// Under h.mu, once.
func (h *Hold) recordEnd(err error) {
	h.metrics.end(err, h.sess)
}

// end records the end of a counted hold (or Group) on sess, with its final error: its
// duration by outcome, one hold fewer, and for a loss its cause, unless that needs a look
// at the lease: then it marks the loss unsettled and reports true (see settleLoss). Once;
// nothing for a hold that is not counted.
func (m *holdMetrics) end(err error, sess *Session) (unsettled bool) {
	if m == nil || m.recorded {
		return false
	}
	m.recorded = true
	t, bg := m.t, context.Background()
	o := released
	if err != nil {
		o = lostHold
	}
	t.ins.hold.Record(bg, time.Since(m.granted).Seconds(), t.byOutcome[o]...)
	if m.counted {
		t.ins.holds.Add(bg, -1, t.plain...)
	}
	if err == nil {
		return false
	}
	if c, known := lossCause(err, sess); known {
		t.ins.lost.Add(bg, 1, t.byCause[c]...)
		return false
	}
	m.unsettled = true
	return true
}

// settleLoss counts the loss of a hold whose key went while its session lived: revoked if
// its lease is gone too (a lease revoked, or expired at etcd before its local deadline,
// takes its keys with it), else deleted. One TimeToLive, bounded by cleanupWait; called,
// outside h.mu, by whoever saw the key go (the keyWatch, the monitor, Check, Release),
// after the hold ended, so that Done is not held up by it. A Group's member settles the
// Group's loss: the Group is what is counted.
func (h *Hold) settleLoss() {
	if h.group != nil {
		h.group.settleLoss()
		return
	}
	settle(&h.mu, &h.metrics, h.cli, h.sess)
}

// unsettled reports whether the hold's loss is still to be counted (see settleLoss).
func (h *Hold) unsettled() bool {
	if h.group != nil {
		return h.group.unsettled()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.metrics != nil && h.metrics.unsettled
}

// settle is settleLoss for the metrics *mp of a hold or Group, guarded by mu: the first
// call counts the loss, any other waits until it is counted.
func settle(mu *sync.Mutex, mp **holdMetrics, cli *clientv3.Client, sess *Session) {
	mu.Lock()
	m := *mp
	switch {
	case m == nil:
		mu.Unlock()
		return
	case m.settled != nil: // settled, or being settled by another: wait for it
		settled := m.settled
		mu.Unlock()
		<-settled
		return
	case !m.unsettled:
		mu.Unlock()
		return
	}
	m.unsettled = false
	settled := make(chan struct{})
	m.settled = settled
	mu.Unlock()
	defer close(settled)
	c := causeDeleted
	if leaseGone(cli, sess) {
		c = causeRevoked
	}
	if sc, known := lossCause(errKeyDeleted, sess); known {
		c = sc // the session has ended meanwhile, and knows why
	}
	m.t.ins.lost.Add(context.Background(), 1, m.t.byCause[c]...)
}

// leaseGone reports whether etcd says sess's lease is gone; false when it cannot tell.
func leaseGone(cli *clientv3.Client, sess *Session) bool {
	ctx, cancel := context.WithTimeout(cli.Ctx(), cleanupWait)
	defer cancel()
	resp, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), sess.id)
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL < 0
}

// lossCause is the cause of a loss with the final error err of a hold on sess; known is
// false for a key gone while the session lived (see settleLoss).
func lossCause(err error, sess *Session) (c cause, known bool) {
	if sc := sess.cause(); sc != nil && errors.Is(err, errKeyDeleted) {
		err = sc // the key went with the session's lease
	}
	switch {
	case errors.Is(err, errDeadline):
		return causeDeadline, true
	case errors.Is(err, errShutdown), errors.Is(err, errClientClosed):
		return causeShutdown, true
	case errors.Is(err, errKeyDeleted):
		return causeDeleted, false
	}
	return causeRevoked, true // errLeaseGone, errCallerEnded, errRetired
}
