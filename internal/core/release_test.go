package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func yielded(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func put(key string, created int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created, ModRevision: created, Version: 1}}
}

// armed registers a release watch on prefix with h and arms it.
func armed(h *hub, prefix string) (*ReleaseWatch, <-chan struct{}) {
	w := newReleaseWatch(prefix)
	h.waiters[w] = struct{}{}
	r := &ReleaseWatch{h: h, w: w}
	return r, r.Arm()
}

func TestAReleaseWatchIsDisarmedUntilArm(t *testing.T) {
	w := newReleaseWatch("n/")
	h := startedHub(10, w)
	h.dispatch(events(del("n/a", 5, 11)))
	assert.False(t, yielded(w.wake))
}

func TestAnArmedReleaseWatchYieldsOnALaterDeleteOfItsKind(t *testing.T) {
	h := startedHub(10)
	h.k.puts = true
	h.dispatch(events(del("n/a", 5, 12)))
	r, ch := armed(h, "n/w")
	// More deletes at 12 may come (a Txn's deletes can span two responses): from 11 on.
	assert.Equal(t, int64(11), r.w.seen, "counts from the last revision wholly dispatched")

	h.dispatch(events(put("n/wx", 13), del("n/rx", 6, 14)))
	assert.False(t, yielded(ch), "an arrival, or a delete of another kind")
	h.dispatch(events(del("n/wy", 7, 15)))
	assert.True(t, yielded(ch))
	h.dispatch(events(del("n/wz", 8, 16)))
	assert.False(t, yielded(ch), "at most once per round")

	ch = r.Arm()
	assert.False(t, yielded(ch), "a new round forgets the old")
	h.dispatch(events(del("n/wq", 9, 17)))
	assert.True(t, yielded(ch))
}

func TestAReleaseWatchArmedBeforeTheWatchStartsYieldsWhenItStarts(t *testing.T) {
	h := &hub{waiters: map[*waiter]struct{}{}}
	_, ch := armed(h, "n/")
	assert.False(t, yielded(ch))
	// The watch may start after the try that followed Arm: a release in between is lost.
	h.dispatch(clientv3.WatchResponse{Created: true, Header: &etcdserverpb.ResponseHeader{Revision: 20}})
	assert.True(t, yielded(ch))
}

func TestAReleaseWatchThatMissedEventsYieldsWithoutARead(t *testing.T) {
	h := startedHub(10)
	_, ch := armed(h, "n/")
	h.mu.Lock()
	for w := range h.waiters {
		w.missed() // what rewatch does after a compaction
	}
	h.mu.Unlock()
	assert.True(t, yielded(ch))
	assert.False(t, h.anyStale(), "a release watch needs no read")
}
