package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// These tests feed the dispatcher watch responses shaped as etcd sends them, to pin down the
// counting rules one by one; the tests against real clusters (mutex/lag_test.go) show that
// the rules hold where members lag.

func del(key string, created, rev int64) *clientv3.Event {
	return &clientv3.Event{
		Type:   mvccpb.DELETE,
		Kv:     &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev},
		PrevKv: &mvccpb.KeyValue{Key: []byte(key), CreateRevision: created},
	}
}

func events(evs ...*clientv3.Event) clientv3.WatchResponse {
	return clientv3.WatchResponse{Events: evs}
}

// startedHub is a hub whose watch started at revision from, with w registered.
func startedHub(from int64, ws ...*waiter) *hub {
	h := &hub{waiters: map[*waiter]struct{}{}}
	for _, w := range ws {
		h.waiters[w] = struct{}{}
	}
	h.dispatch(clientv3.WatchResponse{Created: true, Header: &etcdserverpb.ResponseHeader{Revision: from}})
	return h
}

func TestDeletesAtOrBelowTheSnapshotAreIgnored(t *testing.T) {
	// Queued at revision 20 behind "n/a" (created 15); a lagging member's watch starts at 10.
	w := newWaiter("n/me", 20, 20, 1, "n/", 1)
	h := startedHub(10, w)
	h.dispatch(events(
		del("n/me", 12, 14), // an earlier incarnation of its own key
		del("n/a", 11, 13),  // an earlier incarnation of the predecessor's key, created again at 15
	))
	assert.NoError(t, w.err, "an old delete of its own key taken as news")
	assert.False(t, w.served, "an old delete of its predecessor's key taken as news")
	h.dispatch(events(del("n/a", 15, 21)))
	assert.True(t, w.served)
}

func TestOnlyDeletesOfKeysCreatedBeforeCountAndRepeatsCountOnce(t *testing.T) {
	w := newWaiter("n/me", 20, 20, 2, "n/", 1)
	h := startedHub(20, w)
	h.dispatch(events(del("n/later", 25, 26), del("n/a", 5, 27)))
	h.dispatch(events(del("n/a", 5, 27))) // the client resumed its watch on another member
	assert.Equal(t, 1, w.ahead)
	assert.False(t, w.served)
	h.dispatch(events(del("n/b", 6, 28)))
	assert.True(t, w.served)
}

func TestAKeyOfAnotherKindDoesNotCount(t *testing.T) {
	w := newWaiter("n/rme", 20, 20, 1, "n/w", 1)
	h := startedHub(20, w)
	h.dispatch(events(del("n/rx", 5, 21)))
	assert.Equal(t, 1, w.ahead)
	h.dispatch(events(del("n/wx", 6, 22)))
	assert.True(t, w.served)
}

func TestItsOwnKeyDeletedAfterTheSnapshotIsALoss(t *testing.T) {
	w := newWaiter("n/me", 20, 20, 1, "n/", 1)
	h := startedHub(20, w)
	h.dispatch(events(del("n/me", 20, 23)))
	assert.ErrorIs(t, w.err, ErrLost)
}

func TestALateWaiterCatchesUpFromTheRing(t *testing.T) {
	h := startedHub(10)
	h.dispatch(events(del("n/a", 5, 12), del("n/b", 6, 14)))
	// Its Txn ran at 13, after "n/a" went and before "n/b" did.
	w := newWaiter("n/me", 13, 13, 1, "n/", 1)
	h.waiters[w] = struct{}{}
	h.catchUp(w)
	assert.True(t, w.served)
	assert.False(t, w.stale)
}

func TestAWaiterOlderThanTheWatchIsReadAgain(t *testing.T) {
	w := newWaiter("n/me", 20, 20, 2, "n/", 1)
	h := startedHub(25, w)
	assert.True(t, w.stale, "deletes in (20, 25] are not in the watch")
	h.dispatch(events(del("n/a", 5, 26)))
	assert.Equal(t, 2, w.ahead, "a stale count moved")

	read := []*mvccpb.KeyValue{
		{Key: []byte("n/b"), CreateRevision: 6},
		{Key: []byte("n/me"), CreateRevision: 20},
		{Key: []byte("n/z"), CreateRevision: 24},
	}
	w.recount(read, 26)
	assert.False(t, w.stale)
	assert.Equal(t, 1, w.ahead)
	assert.False(t, w.served)

	gone := newWaiter("n/you", 21, 21, 1, "n/", 1)
	gone.stale = true
	gone.recount(read, 26)
	assert.ErrorIs(t, gone.err, ErrLost, "its key is not in the read")
}
