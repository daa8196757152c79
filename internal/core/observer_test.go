package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func putValue(key string, created, rev int64, value string) *clientv3.Event {
	return &clientv3.Event{
		Type: mvccpb.PUT,
		Kv:   &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created, ModRevision: rev, Value: []byte(value)},
	}
}

// observerAt is an observer whose view was read at revision rev from kvs.
func observerAt(rev int64, kvs ...*mvccpb.KeyValue) *waiter {
	w := &waiter{prefix: "n/", slots: 1, wake: make(chan struct{}, 1), stale: true, obs: &headState{live: map[string]liveKey{}}}
	w.recount(kvs, rev)
	return w
}

func valuesHub(from int64, w *waiter) *hub {
	h := startedHub(from, w)
	h.k.values = true
	return h
}

func TestObserverIgnoresEventsItsReadReflects(t *testing.T) {
	// Read at 20: "n/a" (created 10) leads with "v2". A lagging member's watch starts at 5
	// and replays the put of "v1" and the creation and delete of "n/b".
	w := observerAt(20, &mvccpb.KeyValue{Key: []byte("n/a"), CreateRevision: 10, ModRevision: 18, Value: []byte("v2")})
	h := valuesHub(5, w)
	h.dispatch(events(putValue("n/b", 8, 8, "b")))
	h.dispatch(events(putValue("n/a", 10, 12, "v1"), del("n/b", 8, 14)))
	h.dispatch(events(putValue("n/a", 10, 18, "v2")))
	assert.Equal(t, []Head{{Key: "n/a", Value: "v2", Token: 10}}, w.obs.pending)

	h.dispatch(events(putValue("n/a", 10, 21, "v3"), del("n/a", 0, 22), putValue("n/c", 23, 23, "c")))
	assert.Equal(t, []Head{{"n/a", "v2", 10}, {"n/a", "v3", 10}, {}, {"n/c", "c", 23}}, w.obs.pending)
}

func TestObserverQueuesOnlyChanges(t *testing.T) {
	w := observerAt(20, &mvccpb.KeyValue{Key: []byte("n/a"), CreateRevision: 10, Value: []byte("v")})
	h := valuesHub(20, w)
	// The same value again, and a candidate behind the leader: no change of head.
	h.dispatch(events(putValue("n/a", 10, 21, "v"), putValue("n/b", 22, 22, "b")))
	assert.Len(t, w.obs.pending, 1)
	// A read that finds the same head queues nothing either.
	w.stale = true
	w.recount([]*mvccpb.KeyValue{{Key: []byte("n/a"), CreateRevision: 10, Value: []byte("v")}}, 23)
	assert.Len(t, w.obs.pending, 1)
}

func TestObserverReadOlderThanItsViewStaysStale(t *testing.T) {
	w := observerAt(20)
	h := valuesHub(20, w)
	h.dispatch(events(putValue("n/a", 21, 21, "v")))
	w.missed()
	w.recount(nil, 20) // older than the event applied: it would take the view back
	assert.True(t, w.stale)
	assert.Equal(t, []Head{{}, {"n/a", "v", 21}}, w.obs.pending)
}

func TestObserverDropsTheOldestForASlowReaderWithoutRepeats(t *testing.T) {
	s := &headState{live: map[string]liveKey{}}
	s.put("n/a", 1, "x")
	s.update()
	s.pending, s.taken, s.took = nil, Head{"n/a", "x", 1}, true // the reader took "x"
	// Then y, x, z, y, x, z, ...: one more than the queue holds, so that dropping the
	// oldest (y) would leave the taken x first.
	cycle := []string{"y", "x", "z"}
	for i := range pendingLimit + 1 {
		s.put("n/a", 1, cycle[i%3])
		s.update()
	}
	assert.LessOrEqual(t, len(s.pending), pendingLimit)
	assert.NotEqual(t, s.taken, s.pending[0], "the reader would see the head it took again")
	assert.Equal(t, Head{"n/a", cycle[pendingLimit%3], 1}, s.pending[len(s.pending)-1], "the latest is kept")
}
