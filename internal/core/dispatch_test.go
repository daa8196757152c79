package core

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// These tests feed a hub watch responses shaped as etcd sends them, to pin down what each
// kind of subscriber makes of them, one rule at a time; the tests against real clusters
// (internal/testkit/primtest/lag_test.go, the fault harness) show that the rules hold where members lag.

func del(key string, created, rev int64) *clientv3.Event {
	return &clientv3.Event{
		Type:   mvccpb.DELETE,
		Kv:     &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev},
		PrevKv: &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created},
	}
}

func put(key string, created int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created, ModRevision: created, Version: 1}}
}

func putValue(key string, created, rev int64, value string) *clientv3.Event {
	return &clientv3.Event{
		Type: mvccpb.PUT,
		Kv:   &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created, ModRevision: rev, Value: []byte(value)},
	}
}

func events(evs ...*clientv3.Event) clientv3.WatchResponse {
	return clientv3.WatchResponse{Events: evs}
}

// createdAt is the answer that a watch was created at revision rev. Its Header is a
// pointer in etcd's 3.7 client and a value in 3.6's (the library supports both).
func createdAt(rev int64) clientv3.WatchResponse {
	wr := clientv3.WatchResponse{Created: true}
	header := reflect.ValueOf(&etcdserverpb.ResponseHeader{Revision: rev})
	if f := reflect.ValueOf(&wr).Elem().FieldByName("Header"); f.Kind() == reflect.Pointer {
		f.Set(header)
	} else {
		f.Set(header.Elem())
	}
	return wr
}

// startedHub is a hub in mode whose watch started at revision from, with subs registered.
// It has no goroutine: the test dispatches.
func startedHub(mode watchMode, from int64, subs ...subscriber) *hub {
	h := unstartedHub(mode, subs...)
	h.dispatch(createdAt(from))
	return h
}

func unstartedHub(mode watchMode, subs ...subscriber) *hub {
	h := &hub{k: hubKey{mode: mode}, subs: map[subscriber]struct{}{}}
	for _, s := range subs {
		h.subs[s] = struct{}{}
	}
	return h
}

func yielded(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestDeletesAtOrBelowTheSnapshotAreIgnored(t *testing.T) {
	// Queued at revision 20 behind "n/a" (created 15); a lagging member's watch starts at 10.
	w := newQueueWaiter("n/me", 20, 20, 1, "n/", 1)
	h := startedHub(deletesOnly, 10, w)
	h.dispatch(events(
		del("n/a", 11, 13),  // an earlier incarnation of the predecessor's key, created again at 15
		del("n/me", 12, 14), // an earlier incarnation of its own key
	))
	assert.NoError(t, w.err, "an old delete of its own key taken as news")
	assert.False(t, w.served || w.rereading, "an old delete of its predecessor's key taken as news")
	h.dispatch(events(del("n/a", 15, 21)))
	assert.True(t, w.served)
}

func TestOnlyDeletesOfKeysCreatedBeforeCountAndRepeatsCountOnce(t *testing.T) {
	w := newQueueWaiter("n/me", 20, 20, 2, "n/", 1)
	h := startedHub(deletesOnly, 20, w)
	h.dispatch(events(del("n/later", 25, 26), del("n/a", 5, 27)))
	h.dispatch(events(del("n/a", 5, 27))) // the client resumed its watch on another member
	assert.Equal(t, 1, w.ahead)
	assert.False(t, w.served || w.rereading, "counting")
	h.dispatch(events(del("n/b", 6, 28)))
	assert.True(t, w.served)
}

func TestAKeyOfAnotherKindDoesNotCount(t *testing.T) {
	w := newQueueWaiter("n/rme", 20, 20, 1, "n/w", 1)
	h := startedHub(deletesOnly, 20, w)
	h.dispatch(events(del("n/rx", 5, 21)))
	assert.Equal(t, 1, w.ahead)
	h.dispatch(events(del("n/wx", 6, 22)))
	assert.True(t, w.served)
}

func TestItsOwnKeyDeletedAfterTheSnapshotIsALoss(t *testing.T) {
	w := newQueueWaiter("n/me", 20, 20, 1, "n/", 1)
	h := startedHub(deletesOnly, 20, w)
	h.dispatch(events(del("n/me", 20, 23)))
	done, err := w.outcome()
	assert.True(t, done)
	assert.ErrorIs(t, err, ErrLost)
}

// A lease that ends deletes the holder's key and its own waiter's at one revision: the
// waiter counts its predecessor gone, but its own key went with it, so it is not served,
// in whatever order etcd lists the two deletes.
func TestItsOwnKeyGoingAtTheRevisionThatServesItIsALoss(t *testing.T) {
	for _, order := range [][]*clientv3.Event{
		{del("n/holder", 10, 30), del("n/me", 20, 30)},
		{del("n/me", 20, 30), del("n/holder", 10, 30)},
	} {
		w := newQueueWaiter("n/me", 20, 20, 1, "n/", 1)
		h := startedHub(deletesOnly, 20, w)
		h.dispatch(events(order...))
		done, err := w.outcome()
		assert.True(t, done)
		assert.ErrorIs(t, err, ErrLost, "served on a key that is gone")
	}
}

// The two deletes of one revision may even come in two responses (a watch resumed at that
// revision): a waiter counted served whose own key then goes is still not served, as long
// as its wait has not returned.
func TestItsOwnKeyGoingAfterItWasCountedServedIsALoss(t *testing.T) {
	w := newQueueWaiter("n/me", 20, 20, 1, "n/", 1)
	h := startedHub(deletesOnly, 20, w)
	h.dispatch(events(del("n/holder", 10, 30)))
	h.dispatch(events(del("n/me", 20, 30)))
	_, err := w.outcome()
	assert.ErrorIs(t, err, ErrLost)
}

func TestALateWaiterCatchesUpFromTheRing(t *testing.T) {
	h := startedHub(deletesOnly, 10)
	h.dispatch(events(del("n/a", 5, 12), del("n/b", 6, 14)))
	// Its Txn ran at 13, after "n/a" went and before "n/b" did.
	w := newQueueWaiter("n/me", 13, 13, 1, "n/", 1)
	h.subs[w] = struct{}{}
	h.catchUp(w)
	assert.True(t, w.served)
}

func TestAWaiterOlderThanTheWatchIsReadAgain(t *testing.T) {
	w := newQueueWaiter("n/me", 20, 20, 2, "n/", 1)
	h := startedHub(deletesOnly, 25, w)
	assert.True(t, w.stale(), "deletes in (20, 25] are not in the watch")
	h.dispatch(events(del("n/a", 5, 26)))
	assert.Equal(t, 2, w.ahead, "a stale count moved")

	read := []*mvccpb.KeyValue{
		{Key: []byte("n/b"), CreateRevision: 6},
		{Key: []byte("n/me"), CreateRevision: 20},
		{Key: []byte("n/z"), CreateRevision: 24},
	}
	w.recount(read, 26)
	assert.False(t, w.stale())
	assert.Equal(t, 1, w.ahead)
	assert.False(t, w.served || w.rereading, "counting")

	gone := newQueueWaiter("n/you", 21, 21, 1, "n/", 1)
	gone.missed()
	gone.recount(read, 26)
	assert.ErrorIs(t, gone.err, ErrLost, "its key is not in the read")
}

func TestAStaleWaiterStillSeesItsOwnKeyGo(t *testing.T) {
	w := newQueueWaiter("n/me", 20, 20, 1, "n/", 1)
	h := startedHub(deletesOnly, 25, w) // stale: it needs a read
	h.dispatch(events(del("n/me", 20, 26)))
	assert.ErrorIs(t, w.err, ErrLost)
	assert.False(t, w.stale(), "a failed waiter needs no read")
}

// observerAt is an observer whose view was read at revision rev from kvs.
func observerAt(rev int64, kvs ...*mvccpb.KeyValue) *observer {
	o := &observer{view: view{rereading: true, wake: make(chan struct{}, 1)}, live: map[string]liveKey{}}
	o.recount(kvs, rev)
	return o
}

func TestObserverIgnoresEventsItsReadReflects(t *testing.T) {
	// Read at 20: "n/a" (created 10) leads with "v2". A lagging member's watch starts at 5
	// and replays the put of "v1" and the creation and delete of "n/b".
	o := observerAt(20, &mvccpb.KeyValue{Key: []byte("n/a"), CreateRevision: 10, ModRevision: 18, Value: []byte("v2")})
	h := startedHub(values, 5, o)
	h.dispatch(events(putValue("n/b", 8, 8, "b")))
	h.dispatch(events(putValue("n/a", 10, 12, "v1"), del("n/b", 8, 14)))
	h.dispatch(events(putValue("n/a", 10, 18, "v2")))
	assert.Equal(t, []Head{{Key: "n/a", Value: "v2", Token: 10}}, o.pending)

	h.dispatch(events(putValue("n/a", 10, 21, "v3"), del("n/a", 0, 22), putValue("n/c", 23, 23, "c")))
	assert.Equal(t, []Head{{"n/a", "v2", 10}, {"n/a", "v3", 10}, {}, {"n/c", "c", 23}}, o.pending)
}

// An operator's delete of a range takes the leader and a candidate at one revision: the
// observer must drop both, and never report the candidate as leader.
func TestObserverTakesEveryDeleteOfARevision(t *testing.T) {
	o := observerAt(20,
		&mvccpb.KeyValue{Key: []byte("n/a"), CreateRevision: 10, Value: []byte("leader")},
		&mvccpb.KeyValue{Key: []byte("n/b"), CreateRevision: 15, Value: []byte("candidate")})
	h := startedHub(values, 20, o)
	h.dispatch(events(del("n/a", 0, 21), del("n/b", 0, 21)))
	assert.Equal(t, []Head{{"n/a", "leader", 10}, {}}, o.pending, "a head that went at the same revision was reported")
	h.dispatch(events(putValue("n/c", 22, 22, "next")))
	assert.Equal(t, Head{"n/c", "next", 22}, o.pending[len(o.pending)-1], "the next real leader")
}

func TestObserverQueuesOnlyChanges(t *testing.T) {
	o := observerAt(20, &mvccpb.KeyValue{Key: []byte("n/a"), CreateRevision: 10, Value: []byte("v")})
	h := startedHub(values, 20, o)
	// The same value again, and a candidate behind the leader: no change of head.
	h.dispatch(events(putValue("n/a", 10, 21, "v"), putValue("n/b", 22, 22, "b")))
	assert.Len(t, o.pending, 1)
	// A read that finds the same head queues nothing either.
	o.missed()
	o.recount([]*mvccpb.KeyValue{{Key: []byte("n/a"), CreateRevision: 10, Value: []byte("v")}}, 23)
	assert.Len(t, o.pending, 1)
}

func TestObserverReadOlderThanItsViewStaysStale(t *testing.T) {
	o := observerAt(20)
	h := startedHub(values, 20, o)
	h.dispatch(events(putValue("n/a", 21, 21, "v")))
	o.missed()
	o.recount(nil, 20) // older than the event applied: it would take the view back
	assert.True(t, o.stale())
	assert.Equal(t, []Head{{}, {"n/a", "v", 21}}, o.pending)
}

func TestObserverDropsTheOldestForASlowReaderWithoutRepeats(t *testing.T) {
	o := observerAt(0, &mvccpb.KeyValue{Key: []byte("n/a"), CreateRevision: 1, Value: []byte("x")})
	o.pending, o.taken, o.took = nil, Head{"n/a", "x", 1}, true // the reader took "x"
	// Then y, x, z, y, x, z, ...: one more than the queue holds, so that dropping the
	// oldest (y) would leave the taken x first.
	cycle := []string{"y", "x", "z"}
	for i := range pendingLimit + 1 {
		o.apply(int64(i+2), []event{{key: "n/a", put: true, created: 1, value: cycle[i%3], rev: int64(i + 2)}})
	}
	assert.LessOrEqual(t, len(o.pending), pendingLimit)
	assert.NotEqual(t, o.taken, o.pending[0], "the reader would see the head it took again")
	assert.Equal(t, Head{"n/a", cycle[pendingLimit%3], 1}, o.pending[len(o.pending)-1], "the latest is kept")
}

// armed registers a release watch on prefix with h and arms it.
func armed(h *hub, prefix string) (*ReleaseWatch, <-chan struct{}) {
	r := &ReleaseWatch{wake: make(chan struct{}, 1)}
	w := &releaseWatch{prefix: prefix, wake: r.wake}
	h.subs[w] = struct{}{}
	r.subs = []releaseSub{{h, w}}
	return r, r.Arm()
}

func TestAReleaseWatchIsDisarmedUntilArm(t *testing.T) {
	w := &releaseWatch{prefix: "n/", wake: make(chan struct{}, 1)}
	h := startedHub(deletesOnly, 10, w)
	h.dispatch(events(del("n/a", 5, 11)))
	assert.False(t, yielded(w.wake))
}

func TestAnArmedReleaseWatchYieldsOnALaterDeleteOfItsKind(t *testing.T) {
	h := startedHub(arrivals, 10)
	h.dispatch(events(del("n/a", 5, 12)))
	r, ch := armed(h, "n/w")
	// More deletes at 12 may come (a Txn's deletes can span two responses): from 11 on.
	assert.Equal(t, int64(11), r.subs[0].w.snap, "counts from the last revision wholly dispatched")

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
	h := unstartedHub(deletesOnly)
	_, ch := armed(h, "n/")
	assert.False(t, yielded(ch))
	// The watch may start after the try that followed Arm: a release in between is lost.
	h.dispatch(createdAt(20))
	assert.True(t, yielded(ch))
}

func TestAReleaseWatchThatMissedEventsYieldsWithoutARead(t *testing.T) {
	h := startedHub(deletesOnly, 10)
	_, ch := armed(h, "n/")
	h.resumeFrom(true) // what the pump does after a compaction
	assert.True(t, yielded(ch))
	assert.False(t, h.anyStale(), "a release watch needs no read")
}

func TestASentrySeesAKeyArriveBehindItsHold(t *testing.T) {
	s := &sentry{view: view{snap: 20}, key: "n/rme", rev: 20, prefix: "n/w"}
	h := startedHub(arrivals, 20, s)
	h.dispatch(events(put("n/rx", 21), put("n/wearly", 19)))
	assert.False(t, s.behind, "a reader behind, or a writer ahead")
	h.dispatch(events(put("n/wlate", 22)))
	assert.True(t, s.behind)
}
