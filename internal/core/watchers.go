package core

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// view is what every subscriber that keeps a view of the name embeds: the revision the view
// reflects, whether it waits for a read of the name (the events could not keep it), and
// the error that ended it. wake, if not nil, tells its owner to look. Its fields are
// guarded by the hub's mutex, as the subscriber's own.
type view struct {
	snap      int64 // the revision the view reflects: events at or below it are no news
	rereading bool  // the events cannot keep the view: the hub reads the name
	err       error // the subscriber ended: its key went, or the name could not be read
	wake      chan struct{}
}

func (v *view) since() int64 { return v.snap }

func (v *view) stale() bool { return v.rereading && v.err == nil }

func (v *view) missed() { v.rereading = true }

func (v *view) fail(err error) {
	if v.err == nil {
		v.err = err
		if v.wake != nil {
			signal(v.wake)
		}
	}
}

// reread takes a read of the name at rev as the view's new base, unless the view is not
// stale or the read is older than what it reflects (then it stays stale for the next read).
func (v *view) reread(rev int64) bool {
	if !v.stale() || rev < v.snap {
		return false
	}
	v.snap, v.rereading = rev, false
	return true
}

// A queueWaiter is one queued acquisition as its hub sees it: how many keys are ahead of it
// (or how many units, when keys have weights), as of which revision. Keys created later are
// behind it, so that number only falls: by a key's weight for each delete, after the
// snapshot, of a key created before the waiter's own. A delete's create revision comes with
// the event (its previous value), so a waiter needs no list of the keys ahead, only their
// number.
type queueWaiter struct {
	view
	key    string  // its own key
	rev    int64   // its key's create revision: its place in line
	prefix string  // where the keys that count against it live (the name prefix + Spec.Ahead)
	slots  int     // it is served once fewer than slots keys are ahead
	weigh  weigher // with units: what each key ahead weighs, counted instead of keys
	mark   string  // with a capacity that may change: its marker's range (Spec.CapacityMark)
	units  int     // with a mark: the units it asks, which with the capacity make slots

	ahead  int  // keys in prefix created before rev and alive at snap
	served bool // fewer than slots keys are ahead
	far    bool // it approached (see approach): its hub lingers briefly once it leaves
	by     servedBy
	heard  int64 // the last revision it took in with its key still its own (see Hold.near)
}

// servedBy is what served a waiter, for WithLockDelay: the delete of a key of lease (0
// for none), seen at at; or, when a read served it (known false), the keys in prefix
// created before rev that were there at revision from and not at revision to.
type servedBy struct {
	lease    int64
	known    bool
	at       time.Time
	prefix   string
	rev      int64
	from, to int64
}

// newQueueWaiter makes the waiter of key, created at rev, with ahead keys (or units) ahead
// of it at snap; ahead -1 if that is not known: the hub reads it.
func newQueueWaiter(key string, rev, snap int64, ahead int, prefix string, slots int) *queueWaiter {
	return &queueWaiter{view: view{snap: snap, wake: make(chan struct{}, 1), rereading: ahead < 0}, key: key,
		rev: rev, prefix: prefix, slots: slots, ahead: ahead, served: ahead >= 0 && ahead < slots}
}

// apply counts the deletes of one revision. Its own key's delete is a loss whatever else
// went at the same revision (a lease that ends takes a client's holder and its waiters
// together): the waiter is not served on a key that is already gone. A waiter that is
// re-reading still heeds its own key's delete, which needs no count.
func (w *queueWaiter) apply(rev int64, evs []event) {
	if w.err != nil {
		return
	}
	gone, unknown, by := 0, false, servedBy{}
	for _, e := range evs {
		switch {
		case e.put && e.changed && e.key != w.key && strings.HasPrefix(e.key, w.prefix) && e.created < w.rev && len(w.weigh.passes) > 0:
			if !e.wasKnown {
				unknown = true
				continue
			}
			// A change of mode: a key ahead that counted may pass now, or one that passed
			// count again (an upgrade: the count rises, and the waiter waits on).
			d := w.weigh.ofMode(e.key, e.was, e.wasRev, w.rev) - w.weigh.ofMode(e.key, e.mode, e.modRev, w.rev)
			if gone += d; d > 0 {
				by = servedBy{known: true} // no lease went: no lock-delay
			}
		case e.put:
		case e.key == w.key:
			w.fail(fmt.Errorf("%w: key %s %w", ErrLost, w.key, errDeletedWhileWaiting))
			return
		case w.mark != "" && strings.HasPrefix(e.key, w.mark):
			unknown = true // the capacity changed: a read of the name says to what
		case !strings.HasPrefix(e.key, w.prefix):
		case e.created == 0:
			unknown = true // etcd could not say when the key was created
		case e.created < w.rev && !w.weigh.passing(e.mode, e.modRev, w.rev):
			gone += w.weigh.of(e.key)
			by = servedBy{lease: e.lease, known: true}
		}
	}
	if !w.rereading {
		w.heard = rev
	}
	switch {
	case w.served || w.rereading:
	case unknown:
		w.rereading = true
	default:
		w.count(w.ahead-gone, by)
	}
}

// count sets what is ahead, and is served once it is little enough, by by.
func (w *queueWaiter) count(ahead int, by servedBy) {
	w.ahead = ahead
	if ahead < w.slots {
		w.served = true
		w.by, w.by.at = by, time.Now()
		signal(w.wake)
	}
}

// missed has the waiter's count read again, unless it is served already.
func (w *queueWaiter) missed() {
	if !w.served {
		w.rereading = true
	}
}

// recount renews a stale count from kvs, every key of the name read at revision rev.
func (w *queueWaiter) recount(kvs []*mvccpb.KeyValue, rev int64) {
	from := w.snap
	if !w.reread(rev) {
		return
	}
	own, n := false, 0
	for _, kv := range kvs {
		k := string(kv.Key)
		switch {
		case k == w.key:
			own = kv.CreateRevision == w.rev
		case strings.HasPrefix(k, w.prefix) && kv.CreateRevision < w.rev:
			n += w.weigh.kv(kv, w.rev)
		}
	}
	if !own {
		w.fail(fmt.Errorf("%w: key %s %w", ErrLost, w.key, errDeletedWhileWaiting))
		return
	}
	if c, ok := markedIn(kvs, w.mark); ok {
		if w.slots = c - w.units + 1; w.slots < 1 {
			w.fail(fmt.Errorf("%w: the limit is now %d, below the %d units asked", ErrLimitMismatch, c, w.units))
			return
		}
	}
	w.heard = rev
	w.count(n, servedBy{prefix: w.prefix, rev: w.rev, from: from, to: rev})
}

// outcome is how the wait ended: served (nil), failed (its error), or not yet (done false).
// The error comes first: a waiter whose key went is not served, even if it was counted
// served a moment before.
func (w *queueWaiter) outcome() (done bool, err error) {
	switch {
	case w.err != nil:
		return true, w.err
	case w.served:
		return true, nil
	}
	return false, nil
}

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
	s := &sentry{view: view{snap: hold.rev}, key: hold.key, rev: hold.rev, prefix: q.prefix + kind}
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

// sentry is a Sentry as its hub sees it. Its fields are guarded by the hub's mutex; its
// view's err says the hold's key went.
type sentry struct {
	view
	key    string // the hold's key
	rev    int64  // the hold's create revision
	prefix string // where the keys it looks out for live

	behind bool // a key in prefix was created after rev
}

func (s *sentry) stale() bool { return s.view.stale() && !s.behind }

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

func (s *sentry) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !s.stale() || !s.reread(rev) {
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
}

// A keeper is a hold's key as its client's hub of the name watches it, in place of a watch
// of its own on the keyWatch's stream (see Hold.near): a hold whose waiter that hub
// served (the hub lingers) hears its key's delete there, so that a hand-off in a fleet
// costs no watch created and cancelled, nor a stream opened, for the leader's loss. It
// joins only a hub whose ring holds every event after the revision at which the waiter was
// last heard with its key (joinNear): it never makes the hub read the name. What it hears goes to the keyWatch,
// which tells the hold as it tells those it watches itself; if the hub fails it, the
// keyWatch's stream watches the key from then on (unhub). Its fields are guarded by the
// hub's mutex.
type keeper struct {
	k    *keyWatch
	e    *keyEntry
	hb   *hub // set, under the keyWatch's lock, once it joined
	key  string
	rev  int64 // the key's create revision
	snap int64 // the revision its view reflects: its hold's at (see Hold.near), or a read after a gap
	// rereading: the hub lost events, and reads the name; over: it told the keyWatch.
	rereading, over bool
}

func (p *keeper) since() int64 { return p.snap }

// leave unregisters it from its hub, if it joined one. Not under the hub's lock.
func (p *keeper) leave() {
	if p.hb != nil {
		p.hb.leave(p)
	}
}

func (p *keeper) apply(_ int64, evs []event) {
	for _, e := range evs {
		if !e.put && e.key == p.key {
			p.tell(true)
			return
		}
	}
}

func (p *keeper) missed() { p.rereading = true }

func (p *keeper) stale() bool { return p.rereading && !p.over }

func (p *keeper) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !p.stale() || rev < p.snap {
		return
	}
	p.snap, p.rereading = rev, false
	for _, kv := range kvs {
		if string(kv.Key) == p.key && kv.CreateRevision == p.rev {
			return
		}
	}
	p.tell(true)
}

func (p *keeper) fail(error) { p.tell(false) }

// tell hands the key to the keyWatch once: gone, its delete to tell the hold of; else the
// hub failed, and the stream watches it.
func (p *keeper) tell(gone bool) {
	if p.over {
		return
	}
	p.over = true
	k, e := p.k, p.e
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.holds[e.h] != e || !e.onHub || e.kp != p:
	case gone:
		k.check(keyCheck{e: e, gone: true})
	default:
		k.unhub(e)
	}
}

// unhub watches e's key on the stream from now on: no hub watches it (see keeper). Under
// k.mu.
func (k *keyWatch) unhub(e *keyEntry) {
	if k.holds[e.h] != e || !e.onHub {
		return
	}
	e.onHub = false
	k.hubbed--
	k.place(e)
}

// joinNear registers s with the hub of k if there is one whose watch has started and whose
// ring holds every event after s.since(), so that s needs no read of the name; else it
// returns nil, and starts nothing. Unlike join, it leaves the hub's linger as it is.
func joinNear(k hubKey, s subscriber) *hub {
	st := stateOf(k.cli)
	st.mu.Lock()
	h := st.hubs[k]
	if h == nil {
		st.mu.Unlock()
		return nil
	}
	h.mu.Lock()
	st.mu.Unlock()
	if h.closed || !h.started || s.since() < h.floor {
		h.mu.Unlock()
		return nil
	}
	h.subs[s] = struct{}{}
	h.idleGen++ // a pending idle close no longer applies
	h.catchUp(s)
	first := len(h.subs) == 1
	h.mu.Unlock()
	if first {
		h.pokePump() // it may await a subscriber
	}
	return h
}

// Head is the oldest live key of a name: an election's leader. The zero Head says the name
// has no key.
type Head struct {
	Key   string
	Value string
	Token int64 // the key's create revision
}

// pendingLimit bounds the heads an observer keeps for a reader that lags: past it the
// oldest are dropped, so the reader skips some but still gets the latest, in order.
const pendingLimit = 128

// An Observer follows the head of a name: it queues every change of the oldest live key
// or of its value, in revision order, for Next. It is a registration with the client's
// watch on the name in a mode that delivers every put with its value (one watch per
// client and name for all its observers, apart from its waiters' watch); the watch's hub
// reads the name once when the observer joins and again whenever the events cannot say
// what happened (a compaction took them), and the observer sends no RPC of its own.
//
// The view is exact at each revision it reflects: one linearizable read (at revision R)
// and then the events after R, in order, once each and a whole revision at a time, so that
// a head that went at the same revision as its successor is never reported.
type Observer struct {
	h    *hub
	o    *observer
	once sync.Once
}

// WatchHead starts an observer of the name's head. Stop it when done.
func (q *Queue) WatchHead() *Observer {
	o := &observer{view: view{rereading: true, wake: make(chan struct{}, 1)}, live: map[string]liveKey{}}
	return &Observer{h: join(hubKey{cli: q.cli, prefix: q.prefix, mode: values}, o), o: o}
}

// Next returns the next head: the first call the head at the observer's first read, later
// calls each change after the last one returned (never the same head twice in a row). It
// blocks until there is one or ctx ends (ctx.Err()); another error (the client closed, a
// read of the name refused) ends the observer.
func (o *Observer) Next(ctx context.Context) (Head, error) {
	for {
		o.h.mu.Lock()
		s := o.o
		if len(s.pending) > 0 {
			hd := s.pending[0]
			s.pending = s.pending[1:]
			s.taken, s.took = hd, true
			o.h.mu.Unlock()
			return hd, nil
		}
		err := s.err
		o.h.mu.Unlock()
		if err != nil {
			return Head{}, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Head{}, ctx.Err()
		}
	}
}

// Stop ends the registration; only the first call counts.
func (o *Observer) Stop() { o.once.Do(func() { o.h.leave(o.o) }) }

type liveKey struct {
	created int64
	value   string
}

// observer is an Observer as its hub sees it: every live key of the name, and the heads not
// yet taken by Next. Its fields are guarded by the hub's mutex.
type observer struct {
	view          // snap: the revision of its last read: events at or below it are in the view
	applied int64 // the revision of the last event applied: a read older than it is stale

	live    map[string]liveKey
	last    Head // the head queued last
	queued  bool // a head was queued: last is set
	pending []Head
	taken   Head // the head Next returned last
	took    bool
}

// apply takes one revision's puts and deletes, then looks at the head once: what the
// revision changed together is one change.
func (o *observer) apply(rev int64, evs []event) {
	if o.rereading || o.err != nil {
		return
	}
	for _, e := range evs {
		if e.put {
			o.live[e.key] = liveKey{created: e.created, value: e.value}
		} else {
			delete(o.live, e.key)
		}
	}
	o.applied = rev
	o.update()
}

func (o *observer) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if rev < o.applied || !o.reread(rev) {
		return
	}
	clear(o.live)
	for _, kv := range kvs {
		o.live[string(kv.Key)] = liveKey{created: kv.CreateRevision, value: string(kv.Value)}
	}
	o.applied = rev
	o.update()
}

// head is the live key created first. Linear in the keys, which are the candidates.
func (o *observer) head() Head {
	var hd Head
	for k, v := range o.live {
		if hd.Token == 0 || v.created < hd.Token {
			hd = Head{Key: k, Value: v.value, Token: v.created}
		}
	}
	return hd
}

// update queues the head if it changed.
func (o *observer) update() {
	hd := o.head()
	if o.queued && hd == o.last {
		return
	}
	o.last, o.queued = hd, true
	o.pending = append(o.pending, hd)
	for len(o.pending) > pendingLimit || len(o.pending) > 0 && o.took && o.pending[0] == o.taken {
		o.pending = o.pending[1:] // dropping the oldest must not make the reader see one twice
	}
	signal(o.wake)
}

// Head reads the name's head, linearizably: the zero Head when the name has no key. One
// Range, retried through leader changes until ctx ends.
func (q *Queue) Head(ctx context.Context) (Head, error) {
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return q.cli.Get(clientv3.WithRequireLeader(ctx), q.prefix, clientv3.WithFirstCreate()...)
	})
	if err != nil {
		return Head{}, fmt.Errorf("read the first key of %s: %w", q.prefix, err)
	}
	if len(resp.Kvs) == 0 {
		return Head{}, nil
	}
	kv := resp.Kvs[0]
	return Head{Key: string(kv.Key), Value: string(kv.Value), Token: kv.CreateRevision}, nil
}

// A subscriber is what a hub dispatches a name's events to: a queue waiter, a sentry, a
// release watch or an observer, each a small type of its own. Its methods run under the
// hub's mutex, in revision order, and must not block; a subscriber tells its owner that
// something changed through a channel of its own.
type subscriber interface {
	// since is the revision its view reflects: events at or below it are no news to it.
	since() int64
	// apply takes every event of revision rev, after since, at once: one revision can carry
	// many deletes (a lease's keys, an operator's delete of a range), and what they mean
	// together is not what each means alone.
	apply(rev int64, evs []event)
	// missed says that the events after since can no longer all be delivered.
	missed()
	// stale reports whether it waits for a read of the name (recount).
	stale() bool
	// recount renews its view from every key of the name, read at revision rev.
	recount(kvs []*mvccpb.KeyValue, rev int64)
	// fail ends it with err: the client closed, or etcd refused to read the name.
	fail(err error)
}

// event is one change of a key of the name, as the hub dispatches it.
type event struct {
	key     string
	put     bool   // a put (an arrival on a hub that delivers them, any put on a hub with values), else a delete
	created int64  // create revision of the key; 0 for a delete whose previous value etcd did not give
	lease   int64  // of a deleted key, from its previous value; 0 for none, or not given
	rev     int64  // revision of the event
	value   string // the value put, on a hub with values
	// mode is the mode (see mode.go) of the key's value, and modRev the revision it was
	// written at, on an arrivals hub: put, or, for a delete, the last ("" and 0 when etcd
	// did not give it, and on other hubs). A
	// put of a key that was there already (changed: an arrivals hub delivers those too, for
	// a change of mode) also says the mode it had and since when (was, wasRev), if etcd gave
	// the previous value (wasKnown).
	mode, was      string
	modRev, wasRev int64
	changed        bool
	wasKnown       bool
}
