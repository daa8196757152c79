package core

import (
	"context"
	"fmt"
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
// it. A third, check, reads keys whose watch could not be kept (compaction, a refusal) and
// counts losses that call for an RPC; it runs only while it has work.
//
// The stream requires a leader, so a member cut off from its quorum ends it at once and
// the next one goes to another member; every watch is then created again on the new stream
// from the revision after its key's creation (or the last check), so no delete is missed.
// What the stream cannot tell, a session's end (a lease gone, or its local deadline) and
// the client's close, reaches each hold through the session (sessionEnded) and the client's
// context (run's return).
//
// Every create has an ID never used before: etcd keeps a watch it cancelled for compaction
// registered under its ID until the client cancels it, and refuses a create that reuses one.
// A refused create is answered with ID -1, and etcd answers the creates of a stream in the
// order they came, so a refusal belongs to the oldest create not yet answered (pending).
type keyWatch struct {
	cli *clientv3.Client

	mu       sync.Mutex
	holds    map[*Hold]*keyEntry // every watched hold
	ids      map[int64]*keyEntry // the holds with a watch on the open stream, by its ID
	next     int64               // the last watch ID handed out
	sessions map[*Session]func() bool
	cur      *keyStream         // the open stream; nil while there is none
	checks   []keyCheck         // keys to read before they are watched again
	running  bool               // a run is under way
	gen      uint64             // of the current run: a run stopped for idleness is no longer it
	checking bool               // check is running
	idleGen  uint64             // bumped by every add and idle close: see closeIfIdle
	stop     context.CancelFunc // ends the current run
	crashed  bool               // see crash
	hubbed   int                // holds whose keys hubs watch (onHub): the stream idles without them
}

// keyEntry is a watched hold, as the keyWatch sees it. Under the keyWatch's lock.
type keyEntry struct {
	h    *Hold
	id   int64 // the ID of its create on the open stream; 0 while it has none
	from int64 // the revision its watch starts at
	// checking: its key is being read before it is watched again (see recheck).
	checking bool
	// onHub: the client's hub of its name watches its key (kp, which remove leaves).
	onHub   bool
	refused int // creates etcd refused in a row (see maxRefusals)
	kp      *keeper
}

// keyCheck is a key to read before its hold is watched again: etcd cancelled its watch
// (compaction) or refused to create it on stream. A refusal for the stream's credentials
// (auth) calls for another stream, whose token the read has had clientv3 refresh. A hold
// refused too often is lost without a read (loss), off the stream's goroutine: observe
// takes the hold's lock, which comes before k.mu.
type keyCheck struct {
	e      *keyEntry
	stream *keyStream
	auth   bool
	loss   error // set: the hold is lost, with no read (see maxRefusals)
	gone   bool  // its key was seen deleted: the hold is lost, and why is read (goneErr)
}

// maxRefusals is how many creates of one hold's watch etcd may refuse in a row, each after
// a read found its key still there, before the hold ends as lost: a key that cannot be
// watched cannot tell of its loss.
const maxRefusals = 5

// keyStream is what is to be written on one stream: requests queued while it is open go to
// it, and to no later stream (which creates every watch afresh).
type keyStream struct {
	sends   []*pb.WatchRequest // creates and cancels, in order
	pending []int64            // the IDs of creates not yet answered, oldest first
	wake    chan struct{}      // tells send that sends has something
	end     context.CancelFunc // ends the stream: its run opens another
}

func newKeyWatch(cli *clientv3.Client) *keyWatch {
	return &keyWatch{cli: cli, holds: map[*Hold]*keyEntry{}, ids: map[int64]*keyEntry{}, sessions: map[*Session]func() bool{}}
}

// add starts watching h's key, from the revision after its creation, on a hub of its name
// if a keeper may (see keeper), else on the stream. Under h.mu: it must not call back into h.
func (k *keyWatch) add(h *Hold) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := &keyEntry{h: h, from: h.rev + 1}
	k.holds[h] = e
	k.idleGen++
	if _, ok := k.sessions[h.sess]; !ok {
		s := h.sess
		k.sessions[s] = context.AfterFunc(s.ctx, func() { k.sessionEnded(s) })
	}
	if !h.near {
		k.place(e)
		return
	}
	p := &keeper{k: k, e: e, key: h.key, rev: h.rev, snap: h.at}
	e.kp, e.onHub, k.hubbed = p, true, k.hubbed+1
	k.mu.Unlock()
	hb := joinNear(hubKey{cli: k.cli, prefix: h.key[:h.slot.name], mode: deletesOnly}, p)
	k.mu.Lock()
	switch {
	case hb == nil: // no hub that needs no read: the stream watches it
		e.kp = nil
		k.unhub(e)
	case k.holds[h] != e: // taken meanwhile (the client closed)
		k.mu.Unlock()
		hb.leave(p)
		k.mu.Lock()
	default:
		p.hb = hb
	}
}

// place watches e's key on the stream, opening one if none is open. Under k.mu.
func (k *keyWatch) place(e *keyEntry) {
	k.create(e)
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
	e := k.holds[h]
	if e != nil && e.kp != nil {
		defer e.kp.leave() // after k.mu: a keeper takes it under the hub's lock
	}
	defer k.mu.Unlock()
	if e == nil {
		return
	}
	delete(k.holds, h)
	k.drop(e)
	if e.onHub {
		k.hubbed--
	}
	if len(k.holds) > k.hubbed {
		return
	}
	k.idleGen++
	gen := k.idleGen
	time.AfterFunc(keyWatchLinger, func() { k.closeIfIdle(gen) })
}

// closeIfIdle ends run unless a hold came since idle close gen was armed, or one that the
// stream watches is left; once no hold is left, it forgets the sessions.
func (k *keyWatch) closeIfIdle(gen uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.holds) > k.hubbed || k.idleGen != gen {
		return
	}
	if k.running {
		k.stop()
		k.running, k.cur = false, nil
		k.gen++ // the stopped run leaves the state to the next one
	}
	if len(k.holds) == 0 {
		for s, stop := range k.sessions {
			stop()
			delete(k.sessions, s)
		}
	}
}

// create watches e's key for deletes from e.from on, on the open stream, under a new ID;
// without a stream, the next one creates it. Under k.mu.
func (k *keyWatch) create(e *keyEntry) {
	if k.cur == nil {
		return
	}
	k.next++
	e.id = k.next
	k.ids[e.id] = e
	k.cur.pending = append(k.cur.pending, e.id)
	k.queue(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key:           []byte(e.h.key),
		StartRevision: e.from,
		Filters:       []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT},
		WatchId:       e.id,
	}}})
}

// drop cancels e's watch on the open stream, if it has one: also one that etcd cancelled
// for compaction, which it keeps registered until then. Under k.mu.
func (k *keyWatch) drop(e *keyEntry) {
	if e.id == 0 {
		return
	}
	delete(k.ids, e.id)
	k.queue(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
		CancelRequest: &pb.WatchCancelRequest{WatchId: e.id}}})
	e.id = 0
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
		loss := errMonitorStopped
		if k.cli.Ctx().Err() != nil {
			loss = fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		}
		k.loseAll(loss) // unlocks k.mu
	}()
	var b Backoff
	for ctx.Err() == nil && !k.isCrashed() {
		if k.serve(ctx) {
			b = Backoff{}
		}
		if ctx.Err() != nil || k.isCrashed() {
			return
		}
		// A member without a leader ends the stream at once: do not spin.
		t := time.NewTimer(b.Next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// loseAll removes every watched hold, forgets the sessions, unlocks k.mu, and ends each of
// those holds as lost with loss. Under k.mu.
func (k *keyWatch) loseAll(loss error) {
	left := make([]*keyEntry, 0, len(k.holds))
	for _, e := range k.holds {
		left = append(left, e)
	}
	clear(k.holds)
	clear(k.ids)
	k.hubbed = 0
	for s, stop := range k.sessions {
		stop()
		delete(k.sessions, s)
	}
	k.mu.Unlock()
	for _, e := range left {
		if e.kp != nil {
			e.kp.leave()
		}
		e.h.Lose(loss)
	}
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
	ks := &keyStream{wake: make(chan struct{}, 1), end: cancel}
	k.mu.Lock()
	if ctx.Err() != nil { // stopped for idleness meanwhile: the state is the next run's
		k.mu.Unlock()
		return false
	}
	k.cur = ks
	clear(k.ids) // the watches of the last stream went with it
	for _, e := range k.holds {
		e.id = 0
		if !e.checking && !e.onHub { // one being read is watched again once read
			k.create(e)
		}
	}
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
		k.handle(ks, resp)
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

// handle takes one response of stream ks: the answer to a create, a watch etcd cancelled,
// or events. A delete ends its hold; a watch that could not be kept has its key read.
func (k *keyWatch) handle(ks *keyStream, resp *pb.WatchResponse) {
	k.mu.Lock()
	if resp.Created {
		k.created(ks, resp)
		k.mu.Unlock()
		return
	}
	e := k.ids[resp.WatchId]
	if e == nil || k.cur != ks {
		k.mu.Unlock()
		return // a hold no longer watched, or a stream no longer read
	}
	if resp.Canceled {
		// Compacted past e.from (or cancelled by etcd for another reason): cancel it, read
		// the key, and watch it again from after the read if it is still the hold's.
		k.drop(e)
		k.check(keyCheck{e: e, stream: ks})
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE {
			// Why it went (an operator's record) is read off the stream's goroutine.
			k.mu.Lock()
			if k.ids[resp.WatchId] == e {
				k.check(keyCheck{e: e, gone: true})
			}
			k.mu.Unlock()
			return
		}
	}
}

// created takes etcd's answer to the oldest create of ks not yet answered: a watch in
// place, or a refusal (ID -1, or cancelled at once), whose key is read before the watch is
// created again. Under k.mu.
func (k *keyWatch) created(ks *keyStream, resp *pb.WatchResponse) {
	if len(ks.pending) == 0 {
		return // an answer to nothing asked: not etcd's way
	}
	id := ks.pending[0]
	ks.pending = ks.pending[1:]
	e := k.ids[id]
	if e == nil || k.cur != ks {
		return // removed meanwhile: its cancel follows the create
	}
	if !resp.Canceled && resp.WatchId == id {
		e.refused = 0
		return
	}
	delete(k.ids, id) // etcd registered nothing under it
	e.id = 0
	e.refused++
	if e.refused > maxRefusals {
		k.check(keyCheck{e: e, loss: fmt.Errorf("%w: etcd refused %d times to watch key %s: %s",
			ErrLost, e.refused, e.h.key, resp.CancelReason)})
		return
	}
	k.check(keyCheck{e: e, stream: ks, auth: authRefusal(resp.CancelReason)})
}

// check has e's key read (recheck) before its watch is created again. Under k.mu.
func (k *keyWatch) check(c keyCheck) {
	if c.e.checking {
		return
	}
	c.e.checking = true
	k.checks = append(k.checks, c)
	k.startCheck()
}

// startCheck starts checkAll unless it runs. Under k.mu.
func (k *keyWatch) startCheck() {
	if !k.checking {
		k.checking = true
		go k.checkAll()
	}
}

// checkAll reads the key of each hold whose watch could not be kept, and counts losses,
// until none is left. A read that fails for now is tried again after a pause, until the
// hold ends (its session ends at the latest at its local deadline) or the client closes.
func (k *keyWatch) checkAll() {
	var b Backoff
	for {
		k.mu.Lock()
		checks := k.checks
		k.checks = nil
		if len(checks) == 0 {
			k.checking = false
			k.mu.Unlock()
			return
		}
		k.mu.Unlock()
		var again, gone []keyCheck
		for _, c := range checks {
			if c.gone && c.loss == nil {
				gone = append(gone, c)
			}
		}
		k.tellGone(gone)
		for _, c := range checks {
			if c.gone && c.loss == nil {
				continue
			}
			if !k.recheck(c) {
				again = append(again, c)
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

// recheck reads the key of c's hold: gone or another's, the hold is lost; still its own, it
// is watched again from after the read, on a new stream if c's refused it for its
// credentials. A read that etcd refuses for good ends the hold as lost: its key cannot be
// watched. It reports whether it is done with c.
func (k *keyWatch) recheck(c keyCheck) bool {
	e, h := c.e, c.e.h
	k.mu.Lock()
	watched := k.holds[h] == e
	k.mu.Unlock()
	switch {
	case !watched:
		return true
	case c.loss != nil:
		h.Lose(c.loss)
		h.settleLoss()
		return true
	case c.gone:
		h.Lose(h.goneErr(k.cli.Ctx()))
		h.settleLoss()
		return true
	}
	ctx, cancel := context.WithTimeout(k.cli.Ctx(), tryTimeout)
	defer cancel()
	// clientv3 logs in again when etcd refuses its token, and so renews the credentials
	// that the next stream is opened with.
	resp, err := k.cli.Get(clientv3.WithRequireLeader(ctx), h.key, clientv3.WithKeysOnly())
	switch {
	case err != nil && (transient(err) || ctx.Err() != nil):
		return false
	case err != nil:
		h.Lose(errUnwatchable(h.key, err))
		h.settleLoss()
		return true
	case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev:
		h.Lose(h.goneErr(k.cli.Ctx()))
		h.settleLoss()
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.holds[h] != e {
		return true
	}
	e.from, e.checking = resp.Header.Revision+1, false
	if c.auth && k.cur == c.stream {
		c.stream.end() // its run opens another, which creates every watch
		return true
	}
	k.create(e)
	return true
}

// tellGone ends the holds of cs, whose keys were seen deleted, all at once however many
// they are: a lease that ends deletes every key on it in one revision, and thousands of
// holds must hear of it within a second, not one read after another. Holds whose lease is
// gone (their session knows, or one LeaseTimeToLive per lease says so) are told at once:
// their keys went with it. The others' keys were deleted while their leases lived, by an
// operator's release or by hand: their release records are read together (releasedErrs),
// so that an operator's reason reaches Err.
func (k *keyWatch) tellGone(cs []keyCheck) {
	if len(cs) == 0 {
		return
	}
	bySession := map[*Session][]*Hold{}
	for _, c := range cs {
		e, h := c.e, c.e.h
		k.mu.Lock()
		watched := k.holds[h] == e
		k.mu.Unlock()
		switch {
		case !watched:
		case !h.isHeld():
			// Being released, it sees its own delete go: that needs no reason and must
			// cost no read (the release weighs what it observed).
			h.Lose(KeyGone(h.key))
			h.settleLoss()
		default:
			bySession[h.sess] = append(bySession[h.sess], h)
		}
	}
	var alive []*Hold
	for sess, holds := range bySession {
		if sess.lostErr() == nil && !leaseGone(k.cli, sess) {
			alive = append(alive, holds...)
			continue
		}
		for _, h := range holds {
			h.Lose(KeyGone(h.key))
		}
		for _, h := range holds {
			h.settleLossAs(true)
		}
	}
	var named []*Hold
	for _, h := range alive {
		if h.recordKey() == "" {
			h.Lose(KeyGone(h.key))
			h.settleLossAs(false)
			continue
		}
		named = append(named, h)
	}
	for i, rel := range releasedErrs(k.cli.Ctx(), k.cli, named) {
		h := named[i]
		if rel == nil {
			rel = KeyGone(h.key)
		}
		h.Lose(rel)
		h.settleLossAs(false)
	}
}

func (k *keyWatch) isCrashed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.crashed
}
