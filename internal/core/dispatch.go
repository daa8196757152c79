package core

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ringSize is how many recent events a hub remembers at least (at most twice that), so
// that a subscriber whose snapshot is older than the last event dispatched can catch up
// without a read.
const ringSize = 512

// dispatch hands each new event of wr to every subscriber, once, in revision order, the
// events of one revision together.
func (h *hub) dispatch(wr clientv3.WatchResponse) {
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
}

// newEvent turns ev into the event subscribers see, unless it is not for them (a put that
// is not an arrival) or was dispatched already.
func (h *hub) newEvent(ev *clientv3.Event) (event, bool) {
	put := ev.Type == mvccpb.PUT
	switch {
	case put && h.k.mode == deletesOnly, put && h.k.mode == arrivals && ev.Kv.Version != 1:
		return event{}, false
	case !h.fresh(ev.Kv):
		return event{}, false
	}
	e := event{key: string(ev.Kv.Key), put: put, rev: ev.Kv.ModRevision}
	switch {
	case put:
		e.created = ev.Kv.CreateRevision
		if h.k.mode == values {
			e.value = string(ev.Kv.Value)
		}
	case ev.PrevKv != nil:
		e.created = ev.PrevKv.CreateRevision
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
