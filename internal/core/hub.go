package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hub is the one watch of a client on a name's prefix, shared by all the client's
// subscribers of one kind on that name: a release costs one event per client, not per
// waiter. Its goroutine (the pump) opens the watch, re-opens it when it fails, reads the
// name when a subscriber's view needs it, and dispatches every event, in revision order and
// once, a whole revision at a time (see dispatch). It does all of that outside every
// lock: a watch that is not created (a member cut off) or a read without an answer holds up
// only the subscribers of this hub, and they still return on their own ctx.
//
// Revisions are what make it safe on a cluster. A watch may be served by a member that has
// applied less than the member that ran a waiter's Txn, so it can deliver deletes the
// waiter's snapshot already reflects; the client may resume a watch on another member and
// repeat events; a resumed watch may find its revision compacted. So every event carries its
// revision, a subscriber ignores those at or below its snapshot's, the hub drops repeats by
// revision and key, and a gap it cannot cover is closed by a read.
type hub struct {
	k      hubKey
	ctx    context.Context // the hub's life; ends when it closes or the client does
	cancel context.CancelFunc
	exited chan struct{} // closed when the pump has returned
	poke   chan struct{} // a subscriber waits for a read

	mu        sync.Mutex
	subs      map[subscriber]struct{}
	closed    bool   // no longer in the registry
	idleGen   uint64 // bumped by every join and idle close: see closeIfIdle
	idleLeft  int    // revisions with deletes an idle hub still dispatches before it closes
	servedKey string // of the last waiter that left served: its delete does not count in idleLeft
	started   bool   // the watch has said where it starts: pos is known
	pos       int64  // every event at a revision below pos has been dispatched
	whole     bool   // ... and every one at pos too
	atPos     map[string]bool
	ring      []event // the last dispatched events, oldest first
	floor     int64   // ring holds every event at a revision above floor
}

// pump runs the hub until it closes: the watch, its renewals after failures, and the reads.
func (h *hub) pump() {
	defer close(h.exited)
	var b Backoff
	from := int64(0)
	for {
		var err error
		if h.ctx.Err() == nil { // never a watch on a done ctx: it only churns the client's stream
			wctx, stop := context.WithCancel(clientv3.WithRequireLeader(h.ctx))
			wch := h.k.cli.Watch(wctx, h.k.prefix, h.watchOptions(from)...) // returns once created, or ctx ended
			err = h.drain(wch)
			stop()
		}
		if h.ctx.Err() != nil {
			if h.k.cli.Ctx().Err() != nil {
				h.shut()
				h.failAll(fmt.Errorf("%w: %w", ErrLost, errClientClosed))
			}
			return
		}
		// A member without a leader cancels a watch at once: do not spin.
		t := time.NewTimer(b.Next())
		select {
		case <-t.C:
		case <-h.ctx.Done():
			t.Stop()
			continue // the loop's end: see above
		}
		// After a compaction, or a refusal (permission denied: the grant was revoked while
		// the watch was resumed), the events in between are lost: the subscribers read
		// again, and a read that is refused too fails them.
		from = h.resumeFrom(errors.Is(err, rpctypes.ErrCompacted) || err != nil && !transient(err))
		// Every subscriber failed and left (a refused read): watch again only for a new one,
		// not over and over for nobody until the hub's idle close.
		h.awaitSubscriber()
	}
}

// awaitSubscriber returns once the hub has a subscriber (join pokes the pump), or its ctx
// has ended.
func (h *hub) awaitSubscriber() {
	for {
		h.mu.Lock()
		n := len(h.subs)
		h.mu.Unlock()
		if n > 0 {
			return
		}
		select {
		case <-h.poke:
		case <-h.ctx.Done():
			return
		}
	}
}

// watchOptions are the options of the hub's watch from revision from (0: the present).
func (h *hub) watchOptions(from int64) []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	switch h.k.mode {
	case values: // observers track keys by name: a delete needs no previous value
	case arrivals:
		opts = append(opts, clientv3.WithPrevKV())
	default:
		opts = append(opts, clientv3.WithPrevKV(), clientv3.WithFilterPut())
	}
	if from != 0 {
		// A watch from a past revision waits for etcd's resync loop (up to 100 ms), but this
		// happens only after a fault, and it spares every subscriber a read.
		opts = append(opts, clientv3.WithRev(from))
	}
	return opts
}

// probeEvery is how often a hub of observers reads the cluster's revision (one
// linearizable count of no key). A client that only observes sends nothing else that could
// show the cluster went back in time, and its watch, resumed past the restored revision,
// would wait silently on a leader whose key is gone. (etcd answers no progress request for
// a watch that starts past its revision, so the watch itself cannot tell.)
const probeEvery = 5 * time.Second

// drain dispatches wch's events, and reads the name whenever a subscriber needs it, until
// the watch fails (its error, nil if it just closed) or the hub's ctx ends.
func (h *hub) drain(wch clientv3.WatchChan) error {
	var probe <-chan time.Time
	if h.k.mode == values {
		t := time.NewTicker(probeEvery)
		defer t.Stop()
		probe = t.C
	}
	for {
		if h.anyStale() {
			h.readAll()
		}
		select {
		case <-probe:
			if h.rewound() {
				return nil // rewind closed the hub: the pump returns
			}
		case wr, ok := <-wch:
			if !ok {
				return nil
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if gen, spent := h.dispatch(wr); spent {
				h.closeIfIdle(gen) // the pump returns once ctx ends, next round
			}
		case <-h.poke:
		case <-h.ctx.Done():
			return h.ctx.Err()
		}
	}
}

// resumeFrom says where the next watch starts after a failure: after the last revision
// dispatched whole, or at it (repeats are dropped by key), or, when history was lost or the
// watch never said where it started, from the present, every subscriber then reading again.
func (h *hub) resumeFrom(lost bool) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case lost || !h.started:
		h.started = false
		for s := range h.subs {
			s.missed()
		}
		return 0
	case h.whole:
		return h.pos + 1
	default:
		return h.pos
	}
}

func (h *hub) anyStale() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if s.stale() {
			return true
		}
	}
	return false
}

// rewound reports whether the cluster went back in time, as one linearizable read shows;
// if so, it has rewound the client, which closes this hub too.
func (h *hub) rewound() bool {
	ctx, cancel := context.WithTimeout(h.ctx, tryTimeout)
	defer cancel()
	if rw := clockOf(h.k.cli).confirm(ctx, h.k.cli); rw != nil {
		rewind(h.k.cli, rw)
		return true
	}
	return false
}

// readAll reads every key of the name and renews the view of each stale subscriber from
// it: one Range for all of them, linearizable, so it reflects every event dispatched so
// far. It retries through leader changes until the hub closes; another error fails the
// stale subscribers.
func (h *hub) readAll() {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if h.k.mode == deletesOnly { // arrivals: a waiter may weigh keys by their mode
		opts = append(opts, clientv3.WithKeysOnly())
	}
	var sent int64
	resp, err := Retry(h.ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		sent = clockOf(h.k.cli).now()
		return h.k.cli.Get(clientv3.WithRequireLeader(ctx), h.k.prefix, opts...)
	})
	if err == nil {
		if rw := clockOf(h.k.cli).linear(resp.Header, sent); rw != nil {
			rewind(h.k.cli, rw) // closes this hub too, and tells its subscribers
			return
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		for s := range h.subs {
			if s.stale() {
				s.recount(resp.Kvs, resp.Header.Revision)
			}
		}
	case h.ctx.Err() == nil && !transient(err):
		for s := range h.subs {
			if s.stale() {
				s.fail(fmt.Errorf("read keys of %s: %w", h.k.prefix, err))
			}
		}
	}
}

func (h *hub) failAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.fail(err)
	}
}

// hubLinger is how long a hub keeps its watch after its last subscriber leaves, so that a
// client that waits again soon (a contended lock taken in a loop) finds the watch in place
// and needs no read to cover the gap before a new watch starts. It closes sooner once
// lingerDeletes revisions with deletes went by with no subscriber, or farLingerDeletes if its
// last subscriber came to it from far back in line (see approach): a client whose turn has
// passed stops hearing the releases of a queue that others drain.
const hubLinger = 2 * time.Second

// lingerDeletes is four times nearAhead (8), and farLingerDeletes one: see hubLinger.
// In a loop of Lock and Unlock a client's hub is idle from its waiter's turn to its next
// Lock's write: through its own release and those of the clients served meanwhile. Its own
// release (the delete of the key of the waiter that last left served, see leave) does not
// count, so a client whose waiter came from far back and that locks again before another
// client's release finds the hub and joins it, which gives it the longer linger from then
// on. A client whose turn has passed in a fleet that drains hears one release of another.
func lingerDeletes() int { return 4 * int(nearAhead.Load()) }

func farLingerDeletes() int { return 1 }

// watchMode is what a hub's watch delivers, for the subscribers of its kind.
type watchMode int

const (
	// deletesOnly: every delete, with the key's create revision (waiters, release watches).
	deletesOnly watchMode = iota
	// arrivals: deletes, and every put: the creation of every key, and a change of a key's
	// mode (a queue that WatchArrivals: its waiters and its sentries).
	arrivals
	// values: every put with its value, and every delete (observers).
	values
)

type hubKey struct {
	cli    *clientv3.Client
	prefix string
	mode   watchMode
}

// The hubs of a client are in its state (one per name and mode), under the state's lock,
// which is never held while a hub's lock is awaited for long: a hub's lock guards only what
// is in memory, and no RPC or watch creation runs under it.

// join registers s with the hub of k, starting the hub (its goroutine and its watch) if
// there is none. It never blocks on etcd.
func join(k hubKey, s subscriber) *hub {
	st := stateOf(k.cli)
	st.mu.Lock()
	h, ok := st.hubs[k]
	if !ok {
		h = newHub(k)
		st.hubs[k] = h
	}
	h.mu.Lock()
	st.mu.Unlock()
	h.subs[s] = struct{}{}
	h.idleGen++ // a pending idle close no longer applies
	h.idleLeft = lingerDeletes()
	if w, ok := s.(*queueWaiter); ok && w.far {
		h.idleLeft = farLingerDeletes()
	}
	if h.started {
		h.catchUp(s)
	}
	read := s.stale() || len(h.subs) == 1 // the first may find the pump awaiting a subscriber
	h.mu.Unlock()
	if read {
		h.pokePump()
	}
	return h
}

// hasHub reports whether the client has a hub of k's name and mode, open or lingering.
func hasHub(k hubKey) bool {
	st := stateOf(k.cli)
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.hubs[k]
	return ok
}

// leave unregisters s. Once the last subscriber has left, the hub lingers, then closes. A
// waiter that leaves served leaves its key, whose delete (its hold's release) does not count
// toward the linger's end.
func (h *hub) leave(s subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
	if w, ok := s.(*queueWaiter); ok && w.served && w.err == nil {
		h.servedKey = w.key
	}
	if len(h.subs) > 0 || h.closed {
		return
	}
	h.idleGen++
	gen := h.idleGen
	time.AfterFunc(hubLinger, func() { h.closeIfIdle(gen) })
}

// closeIfIdle closes the hub unless a subscriber came since idle close gen was armed.
func (h *hub) closeIfIdle(gen uint64) {
	st := stateOf(h.k.cli)
	st.mu.Lock()
	h.mu.Lock()
	idle := len(h.subs) == 0 && h.idleGen == gen && !h.closed
	if idle {
		h.unregister(st)
	}
	h.mu.Unlock()
	st.mu.Unlock()
	if idle {
		h.cancel() // the goroutine ends, and with it the watch
	}
}

// unregister marks the hub closed and drops it from its client's state st, so that the next
// join starts a new one. Under st.mu and h.mu.
func (h *hub) unregister(st *clientState) {
	h.closed = true
	if st.hubs[h.k] == h {
		delete(st.hubs, h.k)
	}
}

// shut closes the hub from its own goroutine (the client closed).
func (h *hub) shut() {
	st := stateOf(h.k.cli)
	st.mu.Lock()
	h.mu.Lock()
	h.unregister(st)
	h.mu.Unlock()
	st.mu.Unlock()
}

// closeHubs closes every hub of cli and fails its subscribers with err: the next join starts
// a new hub, with a new watch from the present and a new read.
func closeHubs(cli *clientv3.Client, err error) {
	st := stateOf(cli)
	st.mu.Lock()
	mine := make([]*hub, 0, len(st.hubs))
	for _, h := range st.hubs {
		mine = append(mine, h)
	}
	for _, h := range mine {
		h.mu.Lock()
		h.unregister(st)
		h.mu.Unlock()
	}
	st.mu.Unlock()
	for _, h := range mine {
		h.failAll(err)
		h.cancel()
	}
}

func newHub(k hubKey) *hub {
	ctx, cancel := context.WithCancel(k.cli.Ctx())
	h := &hub{k: k, ctx: ctx, cancel: cancel, exited: make(chan struct{}), poke: make(chan struct{}, 1),
		subs: map[subscriber]struct{}{}}
	go h.pump()
	return h
}

// pokePump tells the hub's goroutine that a subscriber waits for a read.
func (h *hub) pokePump() { signal(h.poke) }

// ringSize is how many recent events a hub remembers at least (at most twice that), so
// that a subscriber whose snapshot is older than the last event dispatched can catch up
// without a read.
const ringSize = 512

// dispatch hands each new event of wr to every subscriber, once, in revision order, the
// events of one revision together. It reports whether the hub has lingered without a
// subscriber through as many revisions with deletes as it may (see hubLinger), and the
// idle close that is then due (see closeIfIdle).
func (h *hub) dispatch(wr clientv3.WatchResponse) (idleGen uint64, spent bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if wr.Created && !h.started {
		h.started, h.pos, h.whole, h.atPos = true, wr.Header.Revision, true, nil
		h.ring, h.floor = h.ring[:0], wr.Header.Revision
		for s := range h.subs {
			h.catchUp(s)
		}
	}
	var batch []event
	for _, ev := range wr.Events {
		e, ok := h.newEvent(ev)
		if !ok {
			continue
		}
		if len(batch) > 0 && batch[0].rev != e.rev {
			h.deliver(batch)
			batch = batch[len(batch):]
		}
		batch = append(batch, e)
	}
	if len(batch) > 0 {
		h.deliver(batch)
	}
	return h.idleGen, len(h.subs) == 0 && h.idleLeft <= 0
}

// newEvent turns ev into the event subscribers see, unless it is not for them (a put that
// is not an arrival) or was dispatched already.
func (h *hub) newEvent(ev *clientv3.Event) (event, bool) {
	put := ev.Type == mvccpb.PUT
	switch {
	case put && h.k.mode == deletesOnly:
		return event{}, false
	case !h.fresh(ev.Kv):
		return event{}, false
	}
	e := event{key: string(ev.Kv.Key), put: put, rev: ev.Kv.ModRevision}
	switch {
	case put:
		e.created, e.changed = ev.Kv.CreateRevision, ev.Kv.Version > 1
		if h.k.mode == values {
			e.value = string(ev.Kv.Value)
		}
	case ev.PrevKv != nil:
		e.created, e.lease = ev.PrevKv.CreateRevision, ev.PrevKv.Lease
	}
	if h.k.mode != arrivals {
		return e, true // modes are for the waiters of a queue that watches arrivals
	}
	switch {
	case put:
		e.mode, e.modRev = ModeOf(string(ev.Kv.Value)), ev.Kv.ModRevision
		if ev.PrevKv != nil {
			e.was, e.wasRev, e.wasKnown = ModeOf(string(ev.PrevKv.Value)), ev.PrevKv.ModRevision, true
		}
	case ev.PrevKv != nil:
		e.mode, e.modRev = ModeOf(string(ev.PrevKv.Value)), ev.PrevKv.ModRevision
	}
	return e, true
}

// deliver remembers the events of one revision and hands them to every subscriber.
func (h *hub) deliver(batch []event) {
	if len(h.ring) >= 2*ringSize { // drop the older half: amortized O(1) per event
		h.floor = h.ring[len(h.ring)/2-1].rev
		h.ring = append(h.ring[:0], h.ring[len(h.ring)/2:]...)
		for len(h.ring) > 0 && h.ring[0].rev <= h.floor { // keep a revision whole or not at all
			h.ring = h.ring[1:]
		}
	}
	h.ring = append(h.ring, batch...)
	if len(h.subs) == 0 && slices.ContainsFunc(batch, func(e event) bool { return !e.put && e.key != h.servedKey }) {
		h.idleLeft--
	}
	for s := range h.subs {
		if batch[0].rev > s.since() {
			s.apply(batch[0].rev, batch)
		}
	}
}

// fresh reports whether kv's event has not been dispatched yet, and records it. A key has
// at most one event per revision (a Txn may not touch a key twice).
func (h *hub) fresh(kv *mvccpb.KeyValue) bool {
	rev, key := kv.ModRevision, string(kv.Key)
	switch {
	case rev < h.pos || (rev == h.pos && (h.whole || h.atPos[key])):
		return false
	case rev == h.pos:
		h.atPos[key] = true
	default:
		h.pos, h.whole, h.atPos = rev, false, map[string]bool{key: true}
	}
	return true
}

// catchUp brings a subscriber whose snapshot is older than the last dispatched event up to
// date from the ring, or tells it that it missed events. Under h.mu, with the watch started.
func (h *hub) catchUp(s subscriber) {
	since := s.since()
	if since >= h.pos {
		return // every event after its snapshot is still to come
	}
	if since < h.floor {
		s.missed()
		return
	}
	for i := 0; i < len(h.ring); {
		j := i + 1
		for j < len(h.ring) && h.ring[j].rev == h.ring[i].rev {
			j++
		}
		if rev := h.ring[i].rev; rev > s.since() {
			s.apply(rev, h.ring[i:j])
		}
		i = j
	}
}

// dispatched is the revision up to which every event has been dispatched, so that a
// registration counting from it misses none that comes later; 0 until the watch has said
// where it starts. It is never ahead of etcd: every later request sees at least it. Under
// h.mu.
func (h *hub) dispatched() int64 {
	switch {
	case !h.started:
		return 0
	case h.whole:
		return h.pos
	default:
		return h.pos - 1 // more events at pos may come; those dispatched are dropped as repeats
	}
}

// signal wakes whoever waits on wake, without blocking: wake has room for one.
func signal(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// nearAhead is how many keys may be ahead of a waiter for it to join its client's hub of the
// name at once (see approach); 2 unless a test set it (SetNearAhead).
var nearAhead atomic.Int64

func init() { nearAhead.Store(2) }

// SetNearAhead sets how many keys may be ahead of a waiter for it to join its client's hub
// at once, and returns what restores it. For the fault suites, which set it to 1 so that
// their few clients approach too; not for use beside other tests.
func SetNearAhead(n int) (restore func()) {
	old := nearAhead.Swap(int64(n))
	return func() { nearAhead.Store(old) }
}
