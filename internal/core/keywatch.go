package core

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keyWatchLinger is how long a client's key watch keeps its stream once no hold is watched,
// so that a loop of Lock, Done, Unlock does not open a stream per hold.
const keyWatchLinger = time.Second

// A keyWatch watches the keys of every watched hold of one client (see Hold.watch) on one
// gRPC watch stream: a watch per key, each with an ID the keyWatch chose, so that a hold
// costs a map entry and a watcher in etcd, not a goroutine and a watch substream of
// clientv3's. Its goroutines run only while a hold is watched (and for keyWatchLinger
// after): run, which opens the stream and reads it, and send, which writes the requests to
// it. A third, check, reads keys whose watch etcd cancelled (compaction, a refusal) and
// counts losses that call for an RPC; it runs only while it has work.
//
// The stream requires a leader, so a member cut off from its quorum ends it at once and
// the next one goes to another member; every watch is then created again on the new stream
// from the revision after its key's creation (or the last check), so no delete is missed.
// What the stream cannot tell, a session's end (a lease gone, or its local deadline) and
// the client's close, reaches each hold through the session (sessionEnded) and the client's
// context (run's return).
type keyWatch struct {
	cli *clientv3.Client

	mu       sync.Mutex
	holds    map[int64]*Hold // every watched hold, by its watch ID
	next     int64           // the last watch ID handed out
	sessions map[*Session]func() bool
	cur      *keyStream         // the open stream; nil while there is none
	checks   []*Hold            // holds whose key must be read before it is watched again
	settles  []*Hold            // lost holds whose loss must be counted (see settleLoss)
	running  bool               // a run is under way
	gen      uint64             // of the current run: a run stopped for idleness is no longer it
	checking bool               // check is running
	idleGen  uint64             // bumped by every add and idle close: see closeIfIdle
	stop     context.CancelFunc // ends the current run
	crashed  bool               // see crash
}

// keyStream is what is to be written on one stream: requests queued while it is open go to
// it, and to no later stream (which creates every watch afresh).
type keyStream struct {
	sends []*pb.WatchRequest // creates and cancels, in order
	wake  chan struct{}      // tells send that sends has something
}

func newKeyWatch(cli *clientv3.Client) *keyWatch {
	return &keyWatch{cli: cli, holds: map[int64]*Hold{}, sessions: map[*Session]func() bool{}}
}

// ownWatch reports whether the holds of cli can be watched on a raw stream: the client's KV
// and Watcher are clientv3's own, so the keys it writes are the keys etcd has. A client
// whose KV or Watcher is wrapped (namespace.NewKV, namespace.NewWatcher, a proxy of the
// caller's) sees keys under another name; its holds are watched through its Watcher, one
// watch each (see Hold.monitor).
func ownWatch(cli *clientv3.Client) bool {
	return reflect.TypeOf(cli.KV) == ownKV && reflect.TypeOf(cli.Watcher) == ownWatcher
}

// The types of clientv3's own KV and Watcher (their constructors touch neither argument
// when both are nil).
var (
	ownKV      = reflect.TypeOf(clientv3.NewKVFromKVClient(nil, nil))
	ownWatcher = reflect.TypeOf(clientv3.NewWatchFromWatchClient(nil, nil))
)

// add starts watching h's key, from the revision after its creation. Under h.mu: it must not
// call back into h.
func (k *keyWatch) add(h *Hold) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next++
	h.watchID = k.next
	k.holds[h.watchID] = h
	k.idleGen++
	if _, ok := k.sessions[h.sess]; !ok {
		s := h.sess
		k.sessions[s] = context.AfterFunc(s.ctx, func() { k.sessionEnded(s) })
	}
	k.queue(createRequest(h))
	if !k.running {
		k.running = true
		k.gen++
		ctx, cancel := context.WithCancel(k.cli.Ctx())
		k.stop = cancel
		go k.run(ctx, k.gen)
	}
}

// remove stops watching h's key. Under h.mu: it must not call back into h.
func (k *keyWatch) remove(h *Hold) {
	k.mu.Lock()
	defer k.mu.Unlock()
	id := h.watchID
	if k.holds[id] != h {
		return
	}
	delete(k.holds, id)
	k.queue(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
		CancelRequest: &pb.WatchCancelRequest{WatchId: id}}})
	if len(k.holds) > 0 {
		return
	}
	k.idleGen++
	gen := k.idleGen
	time.AfterFunc(keyWatchLinger, func() { k.closeIfIdle(gen) })
}

// closeIfIdle ends run unless a hold came since idle close gen was armed.
func (k *keyWatch) closeIfIdle(gen uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.holds) == 0 && k.idleGen == gen && k.running {
		k.stop()
		k.running, k.cur = false, nil
		k.gen++ // the stopped run leaves the state to the next one
		for s, stop := range k.sessions {
			stop()
			delete(k.sessions, s)
		}
	}
}

// createRequest is the request that watches h's key for deletes from h.from on, with h's
// watch ID.
func createRequest(h *Hold) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key:           []byte(h.key),
		StartRevision: h.from,
		Filters:       []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT},
		WatchId:       h.watchID,
	}}}
}

// queue adds a request for the open stream, if any (a stream opened later creates every
// watch anew). Under k.mu.
func (k *keyWatch) queue(r *pb.WatchRequest) {
	if k.cur != nil {
		k.cur.sends = append(k.cur.sends, r)
		signal(k.cur.wake)
	}
}

// run keeps a stream open while a hold is watched and hands what it reads to the holds. It
// returns once the client closes (every watched hold is then lost) or nothing has been
// watched for keyWatchLinger. Should it return with a hold still watched any other way, that
// hold ends as lost: Done must never stay open with nothing left to close it.
func (k *keyWatch) run(ctx context.Context, gen uint64) {
	defer func() {
		k.mu.Lock()
		if k.gen != gen { // stopped for idleness, and perhaps followed by another run
			k.mu.Unlock()
			return
		}
		k.running, k.cur, k.crashed = false, nil, false
		left := k.takeAll()
		k.mu.Unlock()
		loss := errMonitorStopped
		if k.cli.Ctx().Err() != nil {
			loss = fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		}
		for _, h := range left {
			h.observe(loss)
		}
	}()
	var b backoff
	for ctx.Err() == nil && !k.isCrashed() {
		if k.serve(ctx) {
			b = backoff{}
		}
		if ctx.Err() != nil || k.isCrashed() {
			return
		}
		// A member without a leader ends the stream at once: do not spin.
		t := time.NewTimer(b.step())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// takeAll removes every watched hold, and forgets the sessions. Under k.mu.
func (k *keyWatch) takeAll() []*Hold {
	left := make([]*Hold, 0, len(k.holds))
	for id, h := range k.holds {
		left = append(left, h)
		delete(k.holds, id)
	}
	for s, stop := range k.sessions {
		stop()
		delete(k.sessions, s)
	}
	return left
}

// serve opens a stream, creates the watch of every watched hold on it, and reads it until it
// fails or ctx ends. It reports whether the stream got as far as an answer.
func (k *keyWatch) serve(ctx context.Context) (answered bool) {
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stream, err := pb.NewWatchClient(k.cli.ActiveConnection()).Watch(sctx)
	if err != nil {
		return false
	}
	ks := &keyStream{wake: make(chan struct{}, 1)}
	k.mu.Lock()
	if ctx.Err() != nil { // stopped for idleness meanwhile: the state is the next run's
		k.mu.Unlock()
		return false
	}
	k.cur = ks
	for _, h := range k.holds {
		if !h.checking { // one being read is watched again once read
			ks.sends = append(ks.sends, createRequest(h))
		}
	}
	signal(ks.wake)
	k.mu.Unlock()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		k.send(sctx, stream, ks)
		cancel() // a failed send ends the stream: Recv returns
	}()
	defer func() {
		cancel()
		<-sent
		k.mu.Lock()
		if k.cur == ks {
			k.cur = nil
		}
		k.mu.Unlock()
	}()
	for {
		resp, err := stream.Recv()
		if err != nil {
			return answered
		}
		answered = true
		k.handle(resp)
	}
}

// send writes the queued requests to stream until ctx ends or a write fails.
func (k *keyWatch) send(ctx context.Context, stream pb.Watch_WatchClient, ks *keyStream) {
	for {
		k.mu.Lock()
		batch := ks.sends
		ks.sends = nil
		k.mu.Unlock()
		for _, r := range batch {
			if stream.Send(r) != nil {
				return
			}
		}
		select {
		case <-ks.wake:
		case <-ctx.Done():
			return
		}
	}
}

// handle takes one response of the stream: a delete ends its hold, a watch etcd cancelled
// has its key read.
func (k *keyWatch) handle(resp *pb.WatchResponse) {
	k.mu.Lock()
	h := k.holds[resp.WatchId]
	k.mu.Unlock()
	if h == nil {
		return // a hold no longer watched
	}
	if resp.Canceled {
		// Compacted past h.from, or refused (a permission revoked): read the key, and watch
		// it again from after the read if it is still h's.
		k.mu.Lock()
		if k.holds[resp.WatchId] == h && !h.checking {
			h.checking = true
			k.checks = append(k.checks, h)
			k.startCheck()
		}
		k.mu.Unlock()
		return
	}
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE {
			h.observe(errKeyGone(h.key))
			k.settle(h)
			return
		}
	}
}

// settle has the loss of h counted (settleLoss, which may ask etcd whether the lease is
// gone) by check, off the stream's goroutine.
func (k *keyWatch) settle(h *Hold) {
	if !h.unsettled() {
		return
	}
	k.mu.Lock()
	k.settles = append(k.settles, h)
	k.startCheck()
	k.mu.Unlock()
}

// startCheck starts check unless it runs. Under k.mu.
func (k *keyWatch) startCheck() {
	if !k.checking {
		k.checking = true
		go k.check()
	}
}

// check reads the key of each hold whose watch etcd cancelled, and counts losses, until none
// is left. A read that fails is tried again after a pause, until the hold ends (its session
// ends at the latest at its local deadline) or the client closes.
func (k *keyWatch) check() {
	var b backoff
	for {
		k.mu.Lock()
		checks, settles := k.checks, k.settles
		k.checks, k.settles = nil, nil
		if len(checks) == 0 && len(settles) == 0 {
			k.checking = false
			k.mu.Unlock()
			return
		}
		k.mu.Unlock()
		for _, h := range settles {
			h.settleLoss()
		}
		var again []*Hold
		for _, h := range checks {
			if !k.recheck(h) {
				again = append(again, h)
			}
		}
		if len(again) > 0 {
			k.mu.Lock()
			k.checks = append(k.checks, again...)
			k.mu.Unlock()
			if b.wait(k.cli.Ctx()) != nil {
				k.mu.Lock()
				k.checks, k.checking = nil, false
				k.mu.Unlock()
				return // the client closed: run ends every watched hold
			}
		}
	}
}

// recheck reads h's key: gone or another's, h is lost; still h's, it is watched again from
// after the read. It reports whether it is done with h.
func (k *keyWatch) recheck(h *Hold) bool {
	k.mu.Lock()
	watched := k.holds[h.watchID] == h
	k.mu.Unlock()
	if !watched {
		return true
	}
	ctx, cancel := context.WithTimeout(k.cli.Ctx(), tryTimeout)
	defer cancel()
	resp, err := k.cli.Get(clientv3.WithRequireLeader(ctx), h.key, clientv3.WithKeysOnly())
	if err != nil {
		return false
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
		h.observe(errKeyGone(h.key))
		h.settleLoss()
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.holds[h.watchID] == h {
		h.from, h.checking = resp.Header.Revision+1, false
		k.queue(createRequest(h))
	}
	return true
}

// sessionEnded ends every watched hold of s as lost: its lease is gone, or may be.
func (k *keyWatch) sessionEnded(s *Session) {
	k.mu.Lock()
	delete(k.sessions, s)
	var mine []*Hold
	for _, h := range k.holds {
		if h.sess == s {
			mine = append(mine, h)
		}
	}
	k.mu.Unlock()
	loss := s.lostErr()
	for _, h := range mine {
		h.observe(loss)
	}
}

// crash ends run as a goroutine that returned by mistake would (a test's hook).
func (k *keyWatch) crash() {
	k.mu.Lock()
	k.crashed = true
	stop := k.stop
	k.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (k *keyWatch) isCrashed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.crashed
}
