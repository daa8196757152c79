package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"reflect"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// holdState is where a hold is in its life.
type holdState uint8

const (
	held      holdState = iota // granted and not ending
	releasing                  // a Release's fenced delete is under way
	lost                       // ended by a loss that no Release has reported yet
	over                       // ended: released, or lost and reported by a Release
)

// Hold is one granted acquisition: a key at a create revision.
//
// From the first call to Done or Err on, the key is watched (keywatch.go), from the
// revision after its creation so that no delete is missed whenever the watch starts, and so
// is the session, so that Done closes and Err turns ErrLost as soon as etcd says the key is
// gone or the session ends. The watch is one of many on the client's one watch stream, or,
// for a hold its waiter's hub heard served, that hub's (see keeper): a watched hold costs
// no goroutine. It is started on demand because it costs an RPC's worth
// of work, which a holder that never asks should not pay; a loss is still reported by
// Release, whose fenced delete then fails.
//
// A nil *Hold stands for no hold, so that a public handle can pass on the methods of what
// it holds, or of nothing: Token is 0, Done is Closed, Err is ErrNotLocked, and
// Queue.IsOwner gives a compare that never succeeds.
type Hold struct {
	cli  *clientv3.Client
	sess *Session
	slot *slot
	key  string
	rev  int64

	mu    sync.Mutex
	state holdState
	keyed bool // its key is watched on the client's keyWatch
	yield bool // its queue heeds asks (WithYieldOnAsk): a Do's fn's ctx ends at one
	near  bool // its waiter's hub heard it served at revision at (see keeper); set by grant
	// capacity is the capacity it was served under when a change of it was heard while it
	// waited (a semaphore's SetLimit); 0: its spec's. Set before the Hold is handed out. An
	// int32 (MaxUnits fits) beside the flags: a Hold stays in its allocation size class
	// (TestCostPerHold).
	capacity int32
	ending   // its final error: nil after a clean release, ErrLost after a loss
	// seen is a loss the monitor saw while a release was under way, for that release to
	// weigh (the key it saw go may be the release's own); cleared by every release.
	seen    error
	mon     *monitor     // the watch of a hold on a client with a wrapped KV or Watcher
	metrics *holdMetrics // nil unless counted: see Telemetry.Held
	group   *Group       // the Group it is a member of, which is what is counted; nil for none
	timer   *time.Timer  // its maximum hold's (life.go); nil for none
	// at is, with near, the revision at which its waiter's hub last heard its key its own;
	// on a queue that watches arrivals (never near), the revision of its last change of
	// mode (mode.go), 0 before one. One field for the two keeps a Hold in its size class.
	at     int64
	asking *asking // what asks it to let go, once Asked was called
}

func newHold(cli *clientv3.Client, sess *Session, slot *slot, rev int64) *Hold {
	return &Hold{cli: cli, sess: sess, slot: slot, key: slot.key(), rev: rev, ending: ending{done: make(chan struct{})}}
}

// Key is the hold's key; "" for no hold.
func (h *Hold) Key() string {
	if h == nil {
		return ""
	}
	return h.key
}

// Capacity is the capacity the hold was served under, when it heard of a change while it
// waited; 0 when it was served under its spec's.
func (h *Hold) Capacity() int {
	if h == nil {
		return 0
	}
	return int(h.capacity)
}

// Token is the hold's create revision: its fencing token; 0 for no hold.
func (h *Hold) Token() int64 {
	if h == nil {
		return 0
	}
	return h.rev
}

// Lease is the lease the hold's key is on (its session's).
func (h *Hold) Lease() clientv3.LeaseID { return h.sess.Lease() }

// Done is closed when the hold ends, by release or by loss. The first call starts the watch.
// A session known to have ended is reported at once, also on the first call.
func (h *Hold) Done() <-chan struct{} {
	if h == nil {
		return Closed
	}
	h.watch()
	h.checkSession()
	return h.done
}

// Err is nil while the hold lasts or after a clean release, ErrLost after a loss. The first
// call starts the watch; a session known to be dead is reported at once.
func (h *Hold) Err() error {
	if h == nil {
		return ErrNotLocked
	}
	h.watch()
	h.checkSession()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Live reports, without starting the watch or sending an RPC, that the hold has not ended
// and its session is not known to be dead.
func (h *Hold) Live() bool {
	if h == nil || h.sess.ended() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == held
}

// OnEnd arranges for f to be called once when the hold ends, with its final error (nil
// after a clean release, ErrLost after a loss); at once if it has ended. It starts the
// watch, as Done does. f runs under the hold's lock: it must be quick and must not call
// the Hold.
func (h *Hold) OnEnd(f func(error)) {
	h.watch()
	h.checkSession()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addOnEnd(f)
}

// Closed is a closed channel: the Done of no hold.
var Closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// NeverOwner is a Txn compare on key that never succeeds (no key has a negative create
// revision): the IsOwner of no hold. key should lie where the caller may read.
func NeverOwner(key string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(key), "<", 0)
}

// IsOwner is h's IsOwner, or NeverOwner under the queue's prefix for no hold (nil).
func (q *Queue) IsOwner(h *Hold) clientv3.Cmp {
	if h == nil {
		return NeverOwner(q.prefix)
	}
	return h.IsOwner()
}

// IsOwner is a Txn compare that holds only while the hold's key is the one it created.
func (h *Hold) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)
}

// end ends the hold in state (lost or over) with err as its final error: closes done, frees
// the key's slot (the key is gone, or no longer this hold's, so the slot's next key is
// safe from a late delete of this hold's: every delete is fenced on its create revision),
// runs the OnEnd callbacks and stops the monitor. A lost hold moves on to over when a
// Release reports it. Under h.mu.
func (h *Hold) end(state holdState, err error) { h.endWith(state, err, !keyMayRemain(err)) }

// endWith is end, which frees the slot only if free (else its key may still be there).
func (h *Hold) endWith(state holdState, err error, free bool) {
	switch h.state {
	case over:
		return
	case lost:
		h.state = state
		return
	}
	h.state = state
	h.recordEnd(err)
	if h.timer != nil {
		h.timer.Stop()
	}
	if free {
		h.slot.free()
	}
	h.finish(err)
	h.unwatch()
}

// ending is how a hold or a Group ends, once: its Done channel closes, its final error is
// kept, its OnEnd callbacks run. Guarded by its owner's mutex.
type ending struct {
	done  chan struct{} // closed once ended
	err   error         // the final error once ended (a Group records its first loss before)
	onEnd []func(error)
}

// ended reports whether it has ended.
func (e *ending) ended() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// addOnEnd has f called with the final error when it ends; at once if it has.
func (e *ending) addOnEnd(f func(error)) {
	if e.ended() {
		f(e.err)
		return
	}
	e.onEnd = append(e.onEnd, f)
}

// finish ends it with err: closes done and runs the callbacks. Once.
func (e *ending) finish(err error) {
	e.err = err
	close(e.done)
	for _, f := range e.onEnd {
		f(err)
	}
	e.onEnd = nil
}

// Lose records a loss: it ends a hold that is held; during a release, the release weighs
// it (see Release).
func (h *Hold) Lose(loss error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch h.state {
	case held:
		h.end(lost, loss)
	case releasing:
		if h.seen == nil {
			h.seen = loss
		}
	}
}

// checkSession ends the hold as lost if its session is known to have ended.
func (h *Hold) checkSession() {
	if err := h.sess.lostErr(); err != nil {
		h.Lose(err)
	}
}

// Check reads the key, linearizably: alive means it is still the one the hold created, so
// it has existed without a break from the grant until some moment after Check was called.
// If it is not, the hold is lost (Done closes). One Range, retried through leader changes
// until ctx ends.
func (h *Hold) Check(ctx context.Context) (alive bool, err error) {
	sent := clockOf(h.cli).now()
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return h.cli.Get(clientv3.WithRequireLeader(ctx), h.key, clientv3.WithKeysOnly())
	})
	if err != nil {
		return false, fmt.Errorf("check %s: %w", h.key, err)
	}
	if rw := clockOf(h.cli).linear(resp.Header, sent); rw != nil {
		rewind(h.cli, rw)
		h.checkSession()
		return false, nil
	}
	alive = len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == h.rev
	if !alive {
		h.Lose(h.goneErr(ctx))
		h.settleLoss()
	}
	return alive, nil
}

// KeyGone is the loss of a hold whose key is no longer the one it created.
func KeyGone(key string) error {
	return fmt.Errorf("%w: key %s %w", ErrLost, key, errKeyDeleted)
}

// errUnwatchable is the loss of a hold whose key etcd refuses for good to read (a
// permission revoked): a key that cannot be watched cannot tell of its loss. The key may
// still be the hold's, so its release still deletes it (see release).
func errUnwatchable(key string, err error) error {
	return fmt.Errorf("%w: key %s %w: %w", ErrLost, key, errUnwatched, err)
}

var errUnwatched = errors.New("cannot be watched")

// Put writes value into the hold's key, bound to the same lease, only while the key is
// still the one the hold created (IsOwner): a hold that was lost writes nothing. It reports
// whether it wrote. One Txn, retried through leader changes until ctx ends; a retry of a put
// whose answer was lost writes the same value again, which changes only the key's revision.
func (h *Hold) Put(ctx context.Context, value string) (written bool, err error) {
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return h.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(h.IsOwner()).
			Then(clientv3.OpPut(h.key, value, clientv3.WithLease(h.sess.Lease()))).
			Commit()
	})
	if err != nil {
		return false, fmt.Errorf("put %s: %w", h.key, err)
	}
	return resp.Succeeded, nil
}

func (c holdRelease) attempt(ctx context.Context) bool {
	ended, err := c.h.Release(ctx)
	return ended || errors.Is(err, ErrNotLocked)
}

func (c holdRelease) drop() { c.h.Lose(fmt.Errorf("%w: %w", ErrLost, errClientClosed)) }

// isHeld reports whether h is held: neither being released nor ended.
func (h *Hold) isHeld() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == held
}

// watch starts watching the key, unless it is watched already or the hold has ended: on
// the client's keyWatch, or through the client's own Watcher when it is wrapped (see
// ownWatch).
func (h *Hold) watch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keyed || h.mon != nil || h.state == lost || h.state == over {
		return
	}
	if ownWatch(h.cli) {
		h.keyed = true
		stateOf(h.cli).keys.add(h)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.mon = &monitor{stop: cancel, done: make(chan struct{})}
	go h.monitor(ctx)
}

// unwatch stops the watch of a hold that has ended. Under h.mu.
func (h *Hold) unwatch() {
	switch {
	case h.keyed:
		stateOf(h.cli).keys.remove(h)
	case h.mon != nil:
		h.mon.stop()
	}
}

// A monitor is the goroutine that watches the key of a hold on a client whose KV or
// Watcher is wrapped, through that Watcher: the keyWatch's raw stream would watch keys
// other than those the client wrote.
type monitor struct {
	stop context.CancelFunc
	done chan struct{} // closed when the monitor has returned
}

// waitMonitor waits for the monitor, if one was started, to return. Not under h.mu, which
// the monitor takes; call it once the hold has ended (end stops the monitor).
func (h *Hold) waitMonitor() {
	h.mu.Lock()
	m := h.mon
	h.mu.Unlock()
	if m != nil {
		<-m.done
	}
}

// monitor (for a client with a wrapped Watcher) watches the key from the revision after its creation, so no delete is missed
// whenever the watch starts; it re-watches through leader changes until the hold ends. What
// it sees it reports with observe, which ends a held hold at once and leaves a release under
// way to weigh it; it then returns, as there is nothing left to watch.
//
// The session's end interrupts whatever the monitor waits for, also a Watch call, which
// blocks until etcd answers, and the pause between two watches: a session that ends at its
// local deadline is the news that etcd cannot be reached, and the hold must end then, not
// once etcd answers again. In an outage the monitor spends most of its time in that pause
// (a member without a leader refuses the watch at once), so the pause ending early must
// lead to the loss, never to a quiet return.
//
// The monitor returns only once the hold has ended; should it ever return with the hold
// still held, the deferred observe ends the hold as lost: Done must never stay open with
// nothing left to close it.
func (h *Hold) monitor(stop context.Context) {
	defer close(h.mon.done)
	defer h.Lose(errMonitorStopped)
	ctx, cancel := context.WithCancel(stop)
	defer cancel()
	defer context.AfterFunc(h.sess.ctx, cancel)()
	from := h.rev + 1
	var b Backoff
	for {
		var next int64
		var loss error
		if ctx.Err() == nil { // no watch is opened on a done ctx: only what ended it counts
			next, loss = h.watchKey(ctx, from)
		}
		if loss == nil {
			loss = h.sess.lostErr()
		}
		if loss == nil && h.cli.Ctx().Err() != nil {
			// The watch of a closed client ends at once, and may be seen to before the
			// client's end is (watchKey's select picks either): the loss is known now.
			loss = fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		}
		if loss != nil {
			h.Lose(loss)
			h.settleLoss()
			return
		}
		if stop.Err() != nil || ctx.Err() != nil {
			return // the hold ended (end stopped the monitor); else the deferred observe ends it
		}
		from = next
		_ = b.wait(ctx) // cut short by the session's end, which the next round reports
	}
}

// errMonitorStopped is the loss of a hold whose monitor returned while it was still held,
// which no path of the monitor does: the guard that keeps Done from staying open for good.
var errMonitorStopped = fmt.Errorf("%w: the watch of the hold's key and session stopped", ErrLost)

// watchKey returns when the watch fails (with the revision to watch from next), the key is
// gone or nothing can keep it (the loss), the session ends, or ctx ends.
func (h *Hold) watchKey(ctx context.Context, from int64) (next int64, loss error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := h.cli.Watch(wctx, h.key, clientv3.WithRev(from), clientv3.WithFilterPut())
	for {
		select {
		case wr, ok := <-wch:
			switch {
			case !ok:
				return from, nil
			case errors.Is(wr.Err(), rpctypes.ErrCompacted), wr.Canceled && wr.Err() != nil:
				// Compacted past from, or refused (a token issued before a change to the
				// auth store, a permission revoked): read the key before watching again.
				return h.checkKey(ctx, from)
			case wr.Err() != nil:
				return from, nil
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return from, h.goneErr(ctx)
				}
			}
			from = wr.Header.Revision + 1
		case <-h.sess.Done():
			return from, nil // see monitor
		case <-h.cli.Ctx().Done():
			// Nothing can keep or release the key through a closed client.
			return from, fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		case <-ctx.Done():
			return from, nil
		}
	}
}

// checkKey reads the key after a compaction took the history the watch needed, or etcd
// refused the watch; clientv3 logs in again if that was for an old token. A read that etcd
// refuses for good is a loss: the key cannot be watched.
func (h *Hold) checkKey(ctx context.Context, from int64) (next int64, loss error) {
	resp, err := h.cli.Get(clientv3.WithRequireLeader(ctx), h.key)
	switch {
	case err != nil && (transient(err) || ctx.Err() != nil):
		return from, nil
	case err != nil:
		return from, errUnwatchable(h.key, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
		return from, h.goneErr(ctx)
	}
	return resp.Header.Revision + 1, nil
}

// sessionEnded ends every watched hold of s as lost: its lease is gone, or may be.
func (k *keyWatch) sessionEnded(s *Session) {
	k.mu.Lock()
	delete(k.sessions, s)
	var mine []*Hold
	for h := range k.holds {
		if h.sess == s {
			mine = append(mine, h)
		}
	}
	k.mu.Unlock()
	loss := s.lostErr()
	for _, h := range mine {
		h.Lose(loss)
	}
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

// asking is what follows the asks of a hold, or of every member of a Group: ch closes at
// the first ask, err (an *AskedError) set before.
type asking struct {
	once sync.Once
	ch   chan struct{}
	err  error
}

func newAsking() *asking { return &asking{ch: make(chan struct{})} }

func (a *asking) ask(err error) { a.once.Do(func() { a.err = err; close(a.ch) }) }

// Asked returns a channel that is closed once the hold is asked to let go: a record at its
// AskRecordKey that names its token. The first call reads the record and follows it until
// the hold ends (Follow's watch-then-read); nil for no hold.
func (h *Hold) Asked() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.asks(nil).ch
}

// asks is h's asking, shared (a Group's) if h has none yet, following its record from the
// first call on. A hold that has ended, or has no name, is never asked.
func (h *Hold) asks(shared *asking) *asking {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.asking != nil {
		return h.asking
	}
	if h.asking = shared; shared == nil {
		h.asking = newAsking()
	}
	if h.state == held && h.slot != nil && h.slot.name > 0 {
		ctx, cancel := context.WithCancel(h.cli.Ctx())
		h.addOnEnd(func(error) { cancel() })
		go func(a *asking) {
			defer cancel()
			h.followAsks(ctx, a)
		}(h.asking)
	}
	return h.asking
}

// heeds is h's asking if its queue heeds asks (WithYieldOnAsk), following them; else nil.
func (h *Hold) heeds() *asking {
	if h == nil || !h.yield {
		return nil
	}
	return h.asks(nil)
}
