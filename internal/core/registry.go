package core

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// hubLinger is how long a hub keeps its watch after its last subscriber leaves, so that a
// client that waits again soon (a contended lock taken in a loop) finds the watch in place
// and needs no read to cover the gap before a new watch starts.
const hubLinger = 2 * time.Second

// watchMode is what a hub's watch delivers, for the subscribers of its kind.
type watchMode int

const (
	// deletesOnly: every delete, with the key's create revision (waiters, release watches).
	deletesOnly watchMode = iota
	// arrivals: deletes, and the creation of every key (a queue that WatchArrivals: its
	// waiters and its sentries).
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

// leave unregisters s. Once the last subscriber has left, the hub lingers, then closes.
func (h *hub) leave(s subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
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
