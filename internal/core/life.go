package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	"encoding/json"
	"strconv"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hold's life beyond its lease: how long it may last (WithMaxHold), and how long a waiter
// waits after a predecessor that did not let go (WithLockDelay).
//
// A maximum hold is a timer per hold, armed at the grant (no goroutine until it fires):
// when it fires the hold ends as lost with ErrMaxHold, so that Done closes and a Do's ctx
// ends before the key goes, and then its key is deleted, fenced on its create revision, at
// once or by the janitor. Until the key is known gone the slot stays claimed, and a Release
// deletes the key as it does a hold's that could not be watched (keyMayRemain).

// ErrMaxHold: the hold passed its maximum (WithMaxHold) and ended by itself; its key was
// removed. A loss: errors.Is(err, ErrLost) holds too.
var ErrMaxHold = errors.New("etcdsync: the maximum hold passed")

// life is what a queue's options say of its holds' life.
type life struct {
	maxHold   time.Duration // 0: no maximum
	lockDelay time.Duration
	yield     bool // a Do's fn's ctx ends when its hold is asked to let go (WithYieldOnAsk)
}

func lifeOf(c Config) life {
	return life{maxHold: c.MaxHold, lockDelay: c.LockDelay, yield: c.YieldOnAsk}
}

// bound arms the maximum hold of what an acquisition of the queues granted, a Hold or each
// member of a Group, and marks it as heeding asks if its queues do. Before it is handed out.
func bound[T any](qs []*Queue, t T) {
	l := qs[0].life
	switch t := any(t).(type) {
	case *Hold:
		t.yield = l.yield
		t.bound(l.maxHold)
	case *Group:
		t.yield = l.yield
		for _, h := range t.members {
			h.bound(l.maxHold)
		}
	}
}

// bound has the hold end by itself d from now (see expire).
func (h *Hold) bound(d time.Duration) {
	if d <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held {
		h.timer = time.AfterFunc(d, func() { h.expire(d) })
	}
}

// expire ends the hold whose maximum hold d passed, as lost, then deletes its key. A hold
// being released is looked at again a second later: its release may fail and leave it held.
func (h *Hold) expire(d time.Duration) {
	h.mu.Lock()
	switch h.state {
	case releasing:
		h.timer = time.AfterFunc(time.Second, func() { h.expire(d) })
		h.mu.Unlock()
		return
	case held:
		h.end(lost, fmt.Errorf("%w: key %s: %w (%v)", ErrLost, h.key, ErrMaxHold, d))
		h.mu.Unlock()
	default:
		h.mu.Unlock()
		return
	}
	if h.cli.Ctx().Err() != nil {
		return // the key goes with its lease, which nobody renews
	}
	c := &keysCleanup{cli: h.cli, slots: []*slot{h.slot}, revs: []int64{h.rev}, known: true}
	ctx, cancel := context.WithTimeout(h.cli.Ctx(), cleanupWait)
	done := c.attempt(ctx)
	cancel()
	if !done {
		janitorOf(h.cli).add(c)
	}
}

// lockDelay waits, when a predecessor of the waiter's keys went with its lease, until the
// lock-delay has passed since that was seen. served says what served each of its names:
// the delete of a key of a lease, which went with it if etcd says the lease is gone (a
// release leaves it); or a read, after which the keys that went are found in etcd's
// history (one Txn of two Ranges at past revisions), all of whose leases are looked at;
// if the history was compacted, the waiter cannot tell, and waits. One LeaseTimeToLive per
// lease, bounded by cleanupWait; one that gets no answer counts as gone.
func (a *acquisition) lockDelay(ctx context.Context, served []servedBy) error {
	var since time.Time
	for _, s := range served {
		leases, known := []int64{s.lease}, s.known
		if !known {
			leases, known = wentBetween(ctx, a.cli(), s)
		}
		went := !known
		for _, l := range leases {
			went = went || l != 0 && leaseEnded(ctx, a.cli(), l)
		}
		if went && s.at.After(since) {
			since = s.at
		}
	}
	if since.IsZero() {
		return nil
	}
	t := time.NewTimer(time.Until(since.Add(a.qs[0].life.lockDelay)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-a.sess.Done():
		return a.sess.lostErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wentBetween returns the leases of the keys of s.prefix created before s.rev that were
// there at revision s.from and not at s.to; known is false when etcd no longer has that
// history or does not answer within cleanupWait.
func wentBetween(ctx context.Context, cli *clientv3.Client, s servedBy) (leases []int64, known bool) {
	ctx, cancel := context.WithTimeout(ctx, cleanupWait)
	defer cancel()
	at := func(rev int64) clientv3.Op {
		// Not keys only: etcd 3.7 answers those from its index, without the lease.
		return clientv3.OpGet(s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithMaxCreateRev(s.rev-1))
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(at(s.from), at(s.to)).Commit()
	if err != nil {
		return nil, false
	}
	now := make(map[string]int64)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		now[string(kv.Key)] = kv.CreateRevision
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if now[string(kv.Key)] != kv.CreateRevision {
			leases = append(leases, kv.Lease)
		}
	}
	return leases, true
}

// leaseEnded reports whether etcd says lease is gone, or does not answer within
// cleanupWait.
func leaseEnded(ctx context.Context, cli *clientv3.Client, lease int64) bool {
	ctx, cancel := context.WithTimeout(ctx, cleanupWait)
	defer cancel()
	resp, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), clientv3.LeaseID(lease))
	return err != nil || resp.TTL < 0
}

// keyMayRemain reports whether a hold that ended with err may still have its key, which
// its Release then deletes: one that could not be watched, or whose maximum hold passed.
func keyMayRemain(err error) bool {
	return errors.Is(err, errUnwatched) || errors.Is(err, ErrMaxHold)
}

// ErrReleasedByOperator: an operator released the hold (admin.Release, etcdsync release):
// its key was deleted by its token, with a record of why. A loss: errors.Is(err, ErrLost)
// holds too.
var ErrReleasedByOperator = errors.New("etcdsync: released by an operator")

// ReleaseRecord is what an operator's release leaves beside the key it deleted, for the
// holder to read: why, who, when.
type ReleaseRecord struct {
	Reason string    `json:"reason"`
	By     string    `json:"by"` // user@host of the operator
	At     time.Time `json:"at"`
	Token  int64     `json:"token"`
}

// ReleaseRecordKey is where the record of the release of key lies, key being under
// namePrefix (a name's key prefix, NamePrefix after any WithPrefix): namePrefix without its
// '/', "\x00released/", and the rest of key. No name holds a NUL byte, so it is never a
// name's key, and it sorts before namePrefix ('\x00' < '/'), outside the name's range; it
// is under the same WithPrefix, so a prefix grant covers it.
func ReleaseRecordKey(namePrefix, key string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00released/" + strings.TrimPrefix(key, namePrefix)
}

// recordOf is the operator's record in kvs (a release's or an ask's) of the key at token.
func recordOf(kvs []*mvccpb.KeyValue, token int64) (ReleaseRecord, bool) {
	var rec ReleaseRecord
	if len(kvs) == 0 || json.Unmarshal(kvs[0].Value, &rec) != nil || rec.Token != token {
		return ReleaseRecord{}, false
	}
	return rec, true
}

// recordWait bounds the read of a release record: a holder whose key went is told within
// it, with the record's reason or without.
const recordWait = time.Second

// goneErr is the loss of a hold whose key is no longer the one it created: released by an
// operator, with the record's reason, if a record of that release is there; else deleted
// (or gone with its lease). The record is read only while the hold is held: a hold being
// released sees its own delete go, which needs no reason and must cost no read.
func (h *Hold) goneErr(ctx context.Context) error {
	h.mu.Lock()
	live := h.state == held
	h.mu.Unlock()
	// A key that went with its lease needs no record read: the holds of a lease that ends
	// ask once together (leaseGone), not a read each.
	if live && h.sess.lostErr() == nil && !leaseGone(h.cli, h.sess) {
		if err := releasedErr(ctx, h.cli, h.slot, h.rev); err != nil {
			return err
		}
	}
	return KeyGone(h.key)
}

// releasedErr is the loss of the key of slot s created at rev if an operator released it (a
// record of that release is there), else nil. One Range, bounded by recordWait.
func releasedErr(ctx context.Context, cli *clientv3.Client, s *slot, rev int64) error {
	if s == nil || s.name == 0 {
		return nil
	}
	key := s.key()
	ctx, cancel := context.WithTimeout(ctx, recordWait)
	defer cancel()
	resp, err := cli.Get(clientv3.WithRequireLeader(ctx), ReleaseRecordKey(key[:s.name], key))
	if err != nil {
		return nil
	}
	if rec, ok := recordOf(resp.Kvs, rev); ok {
		return operatorLoss(key, rec)
	}
	return nil
}

// recordBatch is how many release records one Txn reads (etcd takes 128 ops by default),
// and recordReaders how many such Txns are in flight at once.
const (
	recordBatch   = 64
	recordReaders = 4
)

// releasedErrs is releasedErr for each of holds, whose keys were all seen gone while their
// leases lived: the records are read in Txns of recordBatch Gets, recordReaders at a time,
// all bounded by recordWait, so that thousands of keys deleted at once (an operator's del
// --prefix) are told within it. A nil entry: no record, or none could be read.
func releasedErrs(ctx context.Context, cli *clientv3.Client, holds []*Hold) []error {
	errs := make([]error, len(holds))
	ctx, cancel := context.WithTimeout(ctx, recordWait)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, recordReaders)
	for start := 0; start < len(holds); start += recordBatch {
		batch := holds[start:min(start+recordBatch, len(holds))]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ops := make([]clientv3.Op, 0, len(batch))
			for _, h := range batch {
				ops = append(ops, clientv3.OpGet(h.recordKey()))
			}
			resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
			if err != nil {
				return
			}
			for i, h := range batch {
				errs[start+i] = h.releasedBy(resp.Responses[i].GetResponseRange().GetKvs())
			}
		}()
	}
	wg.Wait()
	return errs
}

// recordKey is where the record of an operator's release of h's key would lie; "" for a
// hold with no name (see releasedErr).
func (h *Hold) recordKey() string {
	if h.slot == nil || h.slot.name == 0 {
		return ""
	}
	return ReleaseRecordKey(h.key[:h.slot.name], h.key)
}

// releasedBy is the loss of h if kvs, a read of its recordKey, holds the record of an
// operator's release of it; else nil.
func (h *Hold) releasedBy(kvs []*mvccpb.KeyValue) error {
	if rec, ok := recordOf(kvs, h.rev); ok {
		return operatorLoss(h.key, rec)
	}
	return nil
}

// operatorLoss is the loss of the key an operator released, as rec says.
func operatorLoss(key string, rec ReleaseRecord) error {
	return &ReleasedError{Key: key, Record: rec}
}

// ReleasedError is the loss of a hold that an operator released: the key, and the record
// the release left (why, who, when). It matches ErrLost and ErrReleasedByOperator.
type ReleasedError struct {
	Key    string
	Record ReleaseRecord
}

func (e *ReleasedError) Error() string {
	return fmt.Sprintf("%v: %v: key %s: %s (by %s at %s)", ErrLost, ErrReleasedByOperator, e.Key,
		quoteReason(e.Record.Reason), e.Record.By, e.Record.At.Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrLost) and errors.Is(err, ErrReleasedByOperator) hold.
func (e *ReleasedError) Unwrap() []error { return []error{ErrLost, ErrReleasedByOperator} }

// quoteReason is an operator's reason as a loss quotes it: "no reason given" for none.
func quoteReason(reason string) string {
	if reason == "" {
		return "no reason given"
	}
	return strconv.Quote(reason)
}

// whyGone is err, the failure of a wait, or the operator's release of the key of slot s
// created at rev when that is why its key went.
func whyGone(ctx context.Context, cli *clientv3.Client, s *slot, rev int64, err error) error {
	if !errors.Is(err, errDeletedWhileWaiting) {
		return err
	}
	if rel := releasedErr(context.WithoutCancel(ctx), cli, s, rev); rel != nil {
		return rel
	}
	return err
}

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
	if t != nil && h != nil {
		t.held(&h.mu, &h.metrics, &h.ending, h.sess)
	}
}

// HeldGroup is Held for a Group: it counts as one hold of t's primitive, lost when any of
// its members is.
func (t *Telemetry) HeldGroup(g *Group) {
	if t != nil && g != nil {
		t.held(&g.mu, &g.metrics, &g.ending, g.sess)
	}
}

// held is Held for the metrics *mp of a hold or Group on sess that ends with e, all
// guarded by mu.
func (t *Telemetry) held(mu *sync.Mutex, mp **holdMetrics, e *ending, sess *Session) {
	bg := context.Background()
	counted := t.ins.holds.Enabled(bg)
	if !counted && !t.ins.hold.Enabled(bg) && !t.ins.lost.Enabled(bg) {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if *mp != nil {
		return
	}
	if counted {
		t.ins.holds.Add(bg, 1, t.plain...)
	}
	*mp = &holdMetrics{t: t, granted: time.Now(), counted: counted}
	t.ins.live.add(*mp)
	if e.ended() {
		(*mp).end(e.err, sess)
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
	t.ins.live.remove(m)
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
	settle(&h.mu, &h.metrics, h.sess, func() bool { return leaseGone(h.cli, h.sess) })
}

// settleLossAs is settleLoss for a caller that knows whether the hold's lease is gone (see
// keyWatch.tellGone): it asks etcd nothing.
func (h *Hold) settleLossAs(gone bool) {
	if h.group != nil {
		h.group.settleLoss()
		return
	}
	settle(&h.mu, &h.metrics, h.sess, func() bool { return gone })
}

// settle is settleLoss for the metrics *mp of a hold or Group, guarded by mu: the first
// call counts the loss, any other waits until it is counted.
func settle(mu *sync.Mutex, mp **holdMetrics, sess *Session, leaseGone func() bool) {
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
	if sc, known := lossCause(errKeyDeleted, sess); known {
		c = sc // the session has ended meanwhile, and knows why
	} else if leaseGone() {
		c = causeRevoked
	}
	m.t.ins.lost.Add(context.Background(), 1, m.t.byCause[c]...)
}

// leaseGone reports whether etcd says sess's lease is gone; false when it cannot tell. The
// holds of a lease that ends all ask at once: they share one LeaseTimeToLive under way, and
// a lease found gone is never asked about again.
func leaseGone(cli *clientv3.Client, sess *Session) bool {
	sess.mu.Lock()
	if sess.gone {
		sess.mu.Unlock()
		return true
	}
	if a := sess.asking; a != nil {
		sess.mu.Unlock()
		<-a.done
		return a.gone
	}
	a := &leaseAsk{done: make(chan struct{})}
	sess.asking = a
	sess.mu.Unlock()
	ctx, cancel := context.WithTimeout(cli.Ctx(), cleanupWait)
	defer cancel()
	resp, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), sess.id)
	a.gone = errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL < 0
	sess.mu.Lock()
	sess.gone = sess.gone || a.gone
	sess.asking = nil
	sess.mu.Unlock()
	close(a.done)
	return a.gone
}

// lossCause is the cause of a loss with the final error err of a hold on sess; known is
// false for a key gone while the session lived (see settleLoss).
func lossCause(err error, sess *Session) (c cause, known bool) {
	if errors.Is(err, ErrReleasedByOperator) {
		return causeReleased, true
	}
	if errors.Is(err, ErrMaxHold) {
		return causeMaxHold, true
	}
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
