package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hub is the one watch of a client on a name's prefix, shared by all the client's
// subscribers of one kind on that name: a release costs one event per client, not per
// waiter. Its goroutine (the pump) opens the watch, re-opens it when it fails, reads the
// name when a subscriber's view needs it, and dispatches every event, in revision order and
// once, a whole revision at a time (see dispatch.go). It does all of that outside every
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

	mu      sync.Mutex
	subs    map[subscriber]struct{}
	closed  bool   // no longer in the registry
	idleGen uint64 // bumped by every join and idle close: see closeIfIdle
	started bool   // the watch has said where it starts: pos is known
	pos     int64  // every event at a revision below pos has been dispatched
	whole   bool   // ... and every one at pos too
	atPos   map[string]bool
	ring    []event // the last dispatched events, oldest first
	floor   int64   // ring holds every event at a revision above floor
}

// pump runs the hub until it closes: the watch, its renewals after failures, and the reads.
func (h *hub) pump() {
	defer close(h.exited)
	var b backoff
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
		t := time.NewTimer(b.step())
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
			h.dispatch(wr)
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
	if h.k.mode != values {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	var sent int64
	resp, err := retry(h.ctx, func() (*clientv3.GetResponse, error) {
		sent = clockOf(h.k.cli).now()
		return h.k.cli.Get(clientv3.WithRequireLeader(h.ctx), h.k.prefix, opts...)
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
