package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// hubLinger is how long a hub keeps its watch after its last waiter leaves, so that a client
// that waits again soon (a contended lock taken in a loop) finds the watch in place and needs
// no read to cover the gap before a new watch starts. No goroutine of ours runs meanwhile:
// the events wait in the client's watch buffer and the next waiter's pump drains them.
const hubLinger = 2 * time.Second

// ringSize is how many recent deletes a hub remembers at least (at most twice that), so
// that a waiter whose snapshot is older than the last event dispatched can catch up
// without a read.
const ringSize = 512

// A hub is the one watch of a client on a name's prefix, shared by all the client's waiters
// on that name: a release costs one event per client, not per waiter. It dispatches every
// delete, in revision order and once, to each registered waiter, which counts the keys ahead
// of it that go (see waiter.apply). When the events cannot tell a waiter's count (its
// snapshot predates the watch), the hub reads the name's keys once for all such waiters.
//
// Revisions are what make it safe on a cluster. A watch may be served by a member that has
// applied less than the member that ran a waiter's Txn, so it can deliver deletes the
// waiter's snapshot already reflects; the client may resume a watch on another member and
// repeat events; a resumed watch may find its revision compacted. So every event carries its
// revision, a waiter ignores those at or below its snapshot's, the hub drops repeats, and a
// gap it cannot cover is closed by a read.
type hub struct {
	cli    *clientv3.Client
	prefix string
	k      hubKey // k.puts: arrivals (puts) too, for sentries; k.values: every put with its value, for observers

	mu      sync.Mutex
	waiters map[*waiter]struct{}
	wch     clientv3.WatchChan // nil without a watch
	cancel  context.CancelFunc // of the watch
	started bool               // the watch has said where it starts: pos is known
	pos     int64              // every delete at a revision below pos has been dispatched
	whole   bool               // ... and every one at pos too
	atPos   map[string]bool    // else: the keys deleted at pos so far
	ring    []event            // the last dispatched deletes, oldest first
	floor   int64              // ring holds every delete at a revision above floor
	stop    context.CancelFunc // stops the pump; nil while none runs
	pumped  chan struct{}      // closed when the last pump started has stopped
	poke    chan struct{}      // tells the pump that a waiter turned stale
	idle    *time.Timer        // ends the watch after hubLinger without waiters
}

type event struct {
	key     string
	put     bool   // an arrival (only on a hub with puts), any put on a hub with values, else a delete
	created int64  // create revision of the key, 0 if etcd could not say (a delete without its previous value)
	rev     int64  // revision of the event
	value   string // the value put, on a hub with values
}

type hubKey struct {
	cli    *clientv3.Client
	prefix string
	puts   bool // deliver key creations (Version 1 puts) too
	values bool // deliver every put, with its value, and read values in readAll (see Observer)
}

var (
	hubsMu sync.Mutex
	hubs   = map[hubKey]*hub{}
)

// join registers w with the hub of k, creating the hub and its watch if needed.
func join(k hubKey, w *waiter) *hub {
	for {
		if h := tryJoin(k, w); h != nil {
			return h
		}
	}
}

// tryJoin is join, unless the hub's last pump is still stopping: two pumps on one watch
// would split its events and dispatch them out of order. It then waits for that pump to end
// and returns nil, for join to try again.
func tryJoin(k hubKey, w *waiter) *hub {
	hubsMu.Lock()
	h, ok := hubs[k]
	if !ok {
		h = &hub{cli: k.cli, prefix: k.prefix, k: k, waiters: map[*waiter]struct{}{}, poke: make(chan struct{}, 1)}
		hubs[k] = h
	}
	h.mu.Lock() // before hubsMu is released, so that an idle close cannot come between
	hubsMu.Unlock()
	if h.stop == nil && h.pumped != nil {
		select {
		case <-h.pumped:
		default:
			pumped := h.pumped
			h.mu.Unlock()
			<-pumped
			return nil
		}
	}
	defer h.mu.Unlock()

	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	h.waiters[w] = struct{}{}
	if h.wch == nil {
		h.watch(0)
	}
	if h.started {
		h.catchUp(w)
		if w.stale {
			select {
			case h.poke <- struct{}{}:
			default:
			}
		}
	}
	if h.stop == nil {
		var ctx context.Context
		ctx, h.stop = context.WithCancel(context.Background())
		h.pumped = make(chan struct{})
		go h.pump(ctx, h.wch, h.pumped)
	}
	return h
}

// leave unregisters w. The last waiter to leave stops the pump and arms the idle timer.
func (h *hub) leave(w *waiter) {
	h.mu.Lock()
	delete(h.waiters, w)
	if len(h.waiters) > 0 || h.stop == nil {
		h.mu.Unlock()
		return
	}
	stop, pumped := h.stop, h.pumped
	h.stop = nil // pumped stays: a join meanwhile waits for this pump to end
	h.idle = time.AfterFunc(hubLinger, h.closeIfIdle)
	h.mu.Unlock()
	stop()
	<-pumped // no goroutine of ours outlives the last wait
}

// closeIfIdle ends the watch and forgets the hub unless a waiter came back.
func (h *hub) closeIfIdle() {
	hubsMu.Lock()
	defer hubsMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.waiters) > 0 || h.idle == nil {
		return
	}
	h.idle = nil
	if h.cancel != nil {
		h.cancel()
	}
	h.wch, h.cancel = nil, nil
	if hubs[h.k] == h {
		delete(hubs, h.k)
	}
}

// watch opens the hub's watch: from rev if it is not 0 (resuming after a dispatched
// revision), else from the present, which the created response then tells. Under h.mu.
func (h *hub) watch(rev int64) {
	if h.cancel != nil {
		h.cancel()
	}
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	switch {
	case h.k.values: // observers track keys by name: a delete needs no previous value
	case h.k.puts:
		opts = append(opts, clientv3.WithPrevKV())
	default:
		opts = append(opts, clientv3.WithPrevKV(), clientv3.WithFilterPut())
	}
	if rev != 0 {
		// A watch from a past revision waits for etcd's resync loop (up to 100 ms), but this
		// happens only after a fault, and it spares every waiter a read.
		opts = append(opts, clientv3.WithRev(rev))
	} else {
		h.started = false
	}
	h.wch, h.cancel = h.cli.Watch(ctx, h.prefix, opts...), cancel
}

// pump dispatches the watch's events until stopped, replacing the watch when it fails, and
// reads the name's keys when a waiter's count needs it.
func (h *hub) pump(ctx context.Context, wch clientv3.WatchChan, pumped chan struct{}) {
	defer close(pumped)
	var b backoff
	for {
		if h.anyStale() {
			h.readAll(ctx)
		}
		select {
		case wr, ok := <-wch:
			if ok && wr.Err() == nil {
				h.dispatch(wr)
				b = backoff{}
				continue
			}
			if h.cli.Ctx().Err() != nil {
				h.failAll(fmt.Errorf("etcd client closed: %w", h.cli.Ctx().Err()))
				<-ctx.Done()
				return
			}
			var err error
			if ok {
				err = wr.Err()
			}
			select { // a member without a leader cancels a watch at once: do not spin
			case <-ctx.Done():
				return
			case <-b.after():
			}
			// After a compaction, or a refusal (permission denied: the grant was revoked
			// while the watch was resumed), the events in between are lost: the waiters
			// re-read, and a read that is refused too fails them instead of leaving them
			// waiting on a watch that will never be served.
			wch = h.rewatch(wch, errors.Is(err, rpctypes.ErrCompacted) || err != nil && !transient(err))
		case <-h.poke:
		case <-ctx.Done():
			return
		}
	}
}

func (h *hub) anyStale() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.waiters {
		if w.stale {
			return true
		}
	}
	return false
}

// readAll reads every key of the name and renews the count of each stale waiter from it:
// one Range for all of them, linearizable, so it reflects every delete dispatched so far.
// It retries through leader changes until ctx ends; another error fails the stale waiters.
func (h *hub) readAll(ctx context.Context) {
	var b backoff
	for {
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if !h.k.values {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		resp, err := h.cli.Get(clientv3.WithRequireLeader(ctx), h.prefix, opts...)
		if err == nil {
			h.mu.Lock()
			defer h.mu.Unlock()
			for w := range h.waiters {
				w.recount(resp.Kvs, resp.Header.Revision)
			}
			return
		}
		if !transient(err) {
			h.mu.Lock()
			defer h.mu.Unlock()
			for w := range h.waiters {
				if w.stale {
					w.fail(fmt.Errorf("read keys of %s: %w", h.prefix, err))
				}
			}
			return
		}
		if b.wait(ctx) != nil {
			return
		}
	}
}

// rewatch replaces a failed watch: it resumes after the last dispatched revision, or, after
// a compaction or a refusal lost that history (lost), starts from the present and has
// every waiter read again.
func (h *hub) rewatch(failed clientv3.WatchChan, lost bool) clientv3.WatchChan {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wch != failed {
		return h.wch
	}
	switch {
	case lost || !h.started:
		h.watch(0)
		for w := range h.waiters {
			w.missed()
		}
	case h.whole:
		h.watch(h.pos + 1)
	default:
		h.watch(h.pos) // repeats at pos are dropped by key
	}
	return h.wch
}

// dispatch hands each new delete (and, on a hub with puts, each new key; on a hub with
// values, each put) of wr to every waiter, once, in revision order.
func (h *hub) dispatch(wr clientv3.WatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if wr.Created && !h.started {
		h.started, h.pos, h.whole, h.atPos = true, wr.Header.Revision, true, nil
		h.ring, h.floor = h.ring[:0], wr.Header.Revision
		for w := range h.waiters {
			h.catchUp(w)
		}
	}
	for _, ev := range wr.Events {
		put := ev.Type == mvccpb.PUT
		if put && !h.k.values && (!h.k.puts || ev.Kv.Version != 1) || !h.fresh(ev.Kv) {
			continue // only a key's creation is an arrival
		}
		e := event{key: string(ev.Kv.Key), put: put, rev: ev.Kv.ModRevision}
		switch {
		case put:
			e.created = ev.Kv.CreateRevision
			if h.k.values {
				e.value = string(ev.Kv.Value)
			}
		case ev.PrevKv != nil:
			e.created = ev.PrevKv.CreateRevision
		}
		if len(h.ring) == 2*ringSize { // drop the older half: amortized O(1) per event
			h.floor = h.ring[ringSize-1].rev
			h.ring = append(h.ring[:0], h.ring[ringSize:]...)
		}
		h.ring = append(h.ring, e)
		for w := range h.waiters {
			w.apply(e)
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

// catchUp brings a waiter whose snapshot is older than the last dispatched delete up to
// date from the ring, or marks it stale for the pump to read. Under h.mu, with the watch
// started.
func (h *hub) catchUp(w *waiter) {
	if w.seen >= h.pos {
		return // every delete after its snapshot is still to come
	}
	if w.seen < h.floor {
		w.missed()
		return
	}
	for _, e := range h.ring {
		w.apply(e) // those at or below its snapshot it ignores
	}
}

// dispatched is the revision up to which every delete has been dispatched, so that a
// registration counting from it misses none that comes later; 0 until the watch has said
// where it starts. It is never ahead of etcd: every later request sees at least it. Under h.mu.
func (h *hub) dispatched() int64 {
	switch {
	case !h.started:
		return 0
	case h.whole:
		return h.pos
	default:
		return h.pos - 1 // more deletes at pos may come; those dispatched are dropped as repeats
	}
}

func (h *hub) failAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.waiters {
		w.fail(err)
	}
}
