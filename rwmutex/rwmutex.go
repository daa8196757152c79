package rwmutex

import (
	"context"
	"fmt"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The two kinds of key under the name. They are etcd's recipe.RWMutex's, so that its
// readers and writers and ours take turns on a name without '/' and '%'.
const (
	readKind  = core.KindRead
	writeKind = core.KindWrite
)

var (
	// A reader is served once no write key is ahead of it.
	readSpec = core.Spec{Kind: readKind, Ahead: writeKind, Slots: 1}
	// A writer is served once no key at all is ahead of it.
	writeSpec = core.Spec{Kind: writeKind, Slots: 1}
)

// RWMutex is a distributed readers/writer lock on one name. Many readers hold it at once,
// a writer alone, in FIFO order of arrival in etcd: a reader that comes after a waiting
// writer waits behind it, so writers never starve.
//
// Like a sync.RWMutex it is safe for use by several goroutines, and the readers of one
// handle share one etcd key: the first one in writes it, the last one out deletes it. The
// others join with no RPC, and leave after one read of the key, shared by every reader
// leaving at the same time, that proves the key was there all along. A group of readers stops taking members as soon as a
// writer, of this handle or any other, queues behind its key; later readers then queue
// behind that writer.
//
// As with sync.RWMutex, a goroutine must not RLock a handle whose read lock it holds, nor
// Lock one whose read lock it holds: once a writer waits, either call waits forever.
type RWMutex struct {
	name string
	q    *core.Queue
	turn chan struct{} // the writers' one-at-a-time: full while a Lock waits or holds

	mu       sync.Mutex
	write    *core.Hold    // the write hold
	wpending *pendingWrite // while this handle's Lock queues
	groups   []*group      // read groups, oldest first: held or queued
}

// A pendingWrite is a Lock of this handle on its way into the queue. Readers that arrive
// meanwhile wait for it, then queue together right behind it, before the handle's next
// Lock: neither side starves the other.
type pendingWrite struct {
	done    chan struct{} // closed when the Lock has its hold or has failed
	blocked int           // readers waiting for done
	next    *group        // their group, started when done closed (nil if blocked was 0)
}

// A group is the readers of one handle that share one read key.
type group struct {
	queued  chan struct{}      // closed once its key is in etcd, or the acquisition ended
	ready   chan struct{}      // closed once the acquisition has ended, either way
	cancel  context.CancelFunc // of the acquisition
	hold    *core.Hold         // the read hold, once granted
	err     error              // why the acquisition failed
	members int                // readers holding through the group
	waiting int                // readers waiting for its acquisition
	closed  bool               // it takes no more members
	sentry  *core.Sentry       // tells when a writer queued behind it; started by the first joiner

	releasing chan struct{} // while the last reader's release runs; closed after it

	checking bool   // a check of the key is under way
	next     *check // the check to start after it, shared by the readers who wait for it
}

// A check is one read of a group's key that proves, for every reader who left before it
// started, that the key was there all along.
type check struct {
	done  chan struct{}
	alive bool
	err   error
}

// New returns an RWMutex on name over cli. It does no I/O. A bad name returns
// ErrInvalidName, a bad option or a nil client ErrInvalidOption, both wrapped with the detail.
func New(cli *clientv3.Client, name string, opts ...Option) (*RWMutex, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("rwmutex: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("rwmutex %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.Options(opts)
	if err != nil {
		return nil, fmt.Errorf("rwmutex %q: %w", name, err)
	}
	return &RWMutex{
		name: name,
		q:    core.NewQueue(cli, core.SessionsFor(cli, cfg), cfg.KeyPrefix(name)).WatchArrivals(),
		turn: make(chan struct{}, 1),
	}, nil
}

// RLock waits until the read lock is held: until no write key is ahead of its read key.
// If another reader of this handle holds the lock, and no writer has queued since, it joins
// that hold at once, with no RPC; if another is waiting, it waits with it. If ctx ends
// first, it returns ctx's error, wrapped; the last reader of a group to give up deletes the
// group's key before returning.
func (rw *RWMutex) RLock(ctx context.Context) error {
	for {
		rw.mu.Lock()
		if wp := rw.wpending; wp != nil {
			// This handle's writer is queueing: let its key in first, then queue behind it.
			wp.blocked++
			rw.mu.Unlock()
			select {
			case <-wp.done:
			case <-ctx.Done():
			}
			rw.mu.Lock()
			if g := wp.next; g != nil {
				rw.mu.Unlock()
				return rw.await(ctx, g) // counted among its waiting readers
			}
			wp.blocked--
			rw.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return rw.errorf("rlock", err)
			}
			continue
		}
		g := rw.joinable()
		switch {
		case g != nil && g.hold != nil:
			g.members++
			rw.mu.Unlock()
			return nil
		case g == nil:
			if err := ctx.Err(); err != nil {
				rw.mu.Unlock()
				return rw.errorf("rlock", err)
			}
			g = rw.startGroup()
		}
		g.waiting++
		rw.mu.Unlock()
		return rw.await(ctx, g)
	}
}

// joinable returns the newest group if it takes members: it is queued, or it holds, is
// live and no writer has queued behind it. Under rw.mu.
func (rw *RWMutex) joinable() *group {
	if len(rw.groups) == 0 {
		return nil
	}
	g := rw.groups[len(rw.groups)-1]
	if g.closed {
		return nil
	}
	if g.hold != nil {
		if g.sentry == nil {
			g.sentry = rw.q.WatchBehind(g.hold, writeKind)
		}
		if !g.hold.Live() || g.sentry.Behind() {
			g.closed = true
			return nil
		}
	}
	return g
}

// startGroup queues a new group's read key, in a goroutine that ends with the acquisition.
// Under rw.mu.
func (rw *RWMutex) startGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	g := &group{queued: make(chan struct{}), ready: make(chan struct{}), cancel: cancel}
	rw.groups = append(rw.groups, g)
	go rw.acquire(ctx, g)
	return g
}

// acquire runs the group's acquisition. Readers still waiting then become its members; if
// none is left, it releases the hold at once.
func (rw *RWMutex) acquire(ctx context.Context, g *group) {
	defer close(g.ready)
	defer g.cancel()
	var queued sync.Once
	markQueued := func() { queued.Do(func() { close(g.queued) }) }
	defer markQueued()
	h, err := rw.q.AcquireNotify(ctx, readSpec, nil, markQueued)
	rw.mu.Lock()
	if err == nil && g.waiting > 0 {
		g.hold, g.members, g.waiting = h, g.waiting, 0
		rw.mu.Unlock()
		return
	}
	g.err, g.closed = err, true
	rw.dropGroup(g)
	rw.mu.Unlock()
	if err == nil { // every reader gave up meanwhile
		h.Abandon(ctx)
	}
}

// await waits for g's acquisition as one of its waiting readers.
func (rw *RWMutex) await(ctx context.Context, g *group) error {
	select {
	case <-g.ready:
	case <-ctx.Done():
	}
	rw.mu.Lock()
	switch {
	case g.hold != nil:
		rw.mu.Unlock()
		return nil // a member, also if ctx ended at the same moment
	case g.err != nil:
		rw.mu.Unlock()
		return rw.errorf("rlock", g.err)
	}
	g.waiting--
	last := g.waiting == 0
	if last {
		g.closed = true // a reader coming now starts a group of its own
		g.cancel()
	}
	rw.mu.Unlock()
	if last {
		<-g.ready // the acquisition has deleted its key
	}
	return rw.errorf("rlock", ctx.Err())
}

// dropGroup removes g from the handle's groups. Under rw.mu.
func (rw *RWMutex) dropGroup(g *group) {
	rw.groups = slices.DeleteFunc(rw.groups, func(x *group) bool { return x == g })
}

// TryRLock takes the read lock only if no writer holds it or waits for it; otherwise it
// returns ErrLocked having written nothing. It joins a read hold of this handle with no
// RPC where RLock would; else it costs one Txn.
func (rw *RWMutex) TryRLock(ctx context.Context) error {
	rw.mu.Lock()
	if rw.wpending != nil || rw.write != nil {
		rw.mu.Unlock()
		return rw.errorf("try rlock", ErrLocked)
	}
	if g := rw.joinable(); g != nil {
		defer rw.mu.Unlock()
		if g.hold == nil {
			return rw.errorf("try rlock", ErrLocked) // queued: a writer is ahead
		}
		g.members++
		return nil
	}
	rw.mu.Unlock()
	h, err := rw.q.TryAcquire(ctx, readSpec)
	if err != nil {
		return rw.errorf("try rlock", err)
	}
	rw.mu.Lock()
	rw.groups = append(rw.groups, &group{queued: core.Closed, ready: core.Closed, cancel: func() {}, hold: h, members: 1})
	rw.mu.Unlock()
	return nil
}

// RUnlock ends one reader's hold. The last reader of a group deletes the group's key: one
// Txn, fenced like Unlock's. The others need proof that the key was there all along, so
// that a reader cut off from etcd (whose lease may have expired and a writer come in)
// cannot take its read for a sound one: a read of the key that starts after their call,
// one for every batch of readers leaving at once. It returns ErrNotLocked without a read
// hold, and ErrLost if the hold was lost (the reader's hold ends all the same). If etcd
// cannot be reached before ctx ends, the read lock stays held and RUnlock may be called
// again.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	rw.mu.Lock()
	i := slices.IndexFunc(rw.groups, func(g *group) bool { return g.members > 0 })
	if i < 0 {
		rw.mu.Unlock()
		return rw.errorf("runlock", ErrNotLocked)
	}
	// Any group will do: while a reader holds through a younger group, no writer can be
	// served between the two, so releasing the oldest first is safe and best for writers.
	g := rw.groups[i]
	g.members--
	if g.members > 0 {
		c := rw.checkLater(g)
		rw.mu.Unlock()
		return rw.leave(ctx, g, c)
	}
	g.closed = true
	g.releasing = make(chan struct{})
	sentry := g.sentry
	g.sentry = nil
	rw.mu.Unlock()
	if sentry != nil {
		sentry.Stop()
	}
	ended, err := g.hold.Release(ctx)
	rw.mu.Lock()
	if ended {
		rw.dropGroup(g)
	} else {
		g.members++ // still held: the next RUnlock tries again
	}
	close(g.releasing)
	g.releasing = nil
	rw.mu.Unlock()
	if err != nil {
		return rw.errorf("runlock", err)
	}
	return nil
}

// checkLater returns the next check of g's key that starts from now on, starting the
// checks if none runs. Under rw.mu.
func (rw *RWMutex) checkLater(g *group) *check {
	if g.next == nil {
		g.next = &check{done: make(chan struct{})}
	}
	c := g.next
	if !g.checking {
		g.checking = true
		go rw.runChecks(g)
	}
	return c
}

// runChecks reads g's key once for each batch of readers leaving, until none waits.
func (rw *RWMutex) runChecks(g *group) {
	for {
		rw.mu.Lock()
		c := g.next
		g.next = nil
		if c == nil {
			g.checking = false
			rw.mu.Unlock()
			return
		}
		rw.mu.Unlock()
		ctx, cancel := core.Detached(context.Background())
		c.alive, c.err = g.hold.Check(ctx)
		cancel()
		close(c.done)
	}
}

// leave waits for c, the check that proves a leaving reader held until it left: the
// group's key existed from its creation until after the reader's RUnlock was called. When
// that cannot be known before ctx ends, the reader still holds and may RUnlock again.
func (rw *RWMutex) leave(ctx context.Context, g *group, c *check) error {
	select {
	case <-c.done:
		switch {
		case c.err != nil:
		case c.alive:
			return nil
		default:
			// Gone: lost, or deleted by the last reader's release, which then proves as
			// much as the check would have. The hold ends either way.
			select {
			case <-g.hold.Done():
				if err := g.hold.Err(); err != nil {
					return rw.errorf("runlock", err)
				}
				return nil
			case <-ctx.Done():
			}
		}
	case <-ctx.Done():
	}
	rw.mu.Lock()
	if ch := g.releasing; ch != nil {
		// The last reader is releasing the group: its outcome settles this reader's too.
		rw.mu.Unlock()
		<-ch
		rw.mu.Lock()
	}
	if !slices.Contains(rw.groups, g) {
		// Released by the last reader: its fenced delete proves the key was there.
		rw.mu.Unlock()
		if err := g.hold.Err(); err != nil {
			return rw.errorf("runlock", err)
		}
		return nil
	}
	g.members++
	rw.mu.Unlock()
	err := ctx.Err()
	select {
	case <-c.done:
		if c.err != nil {
			err = c.err
		}
	default:
	}
	return rw.errorf("runlock", err)
}

// Lock waits until the write lock is held: until no key, read or write, is ahead of its
// key. Readers of this handle that arrive meanwhile queue behind it. If ctx ends first it
// returns ctx's error, wrapped, after deleting its key (see mutex.Mutex.Lock for the
// details, which are the same).
//
// Like a sync.RWMutex, a handle's write side stays taken from Lock to Unlock, also when
// the hold was lost in between: call Unlock (it returns ErrLost) before Lock again.
func (rw *RWMutex) Lock(ctx context.Context) error {
	select {
	case rw.turn <- struct{}{}:
	case <-ctx.Done():
		return rw.errorf("lock", ctx.Err())
	}
	wp := &pendingWrite{done: make(chan struct{})}
	rw.mu.Lock()
	rw.wpending = wp
	var ahead []*group
	for _, g := range rw.groups {
		g.closed = true
		ahead = append(ahead, g)
	}
	rw.mu.Unlock()
	// Readers of this handle that came before this Lock queue before it.
	for _, g := range ahead {
		select {
		case <-g.queued:
		case <-ctx.Done():
		}
	}
	var h *core.Hold
	err := ctx.Err()
	if err == nil {
		h, err = rw.q.Acquire(ctx, writeSpec, nil)
	}
	rw.mu.Lock()
	rw.wpending, rw.write = nil, h
	if wp.blocked > 0 {
		wp.next = rw.startGroup()
		wp.next.waiting = wp.blocked
	}
	rw.mu.Unlock()
	close(wp.done)
	if err != nil {
		<-rw.turn
		return rw.errorf("lock", err)
	}
	return nil
}

// TryLock takes the write lock only if nobody holds the lock or waits for it, reader or
// writer; otherwise, or if this handle holds or waits already, it returns ErrLocked having
// written nothing. One Txn, none when this handle's own readers are in the way.
func (rw *RWMutex) TryLock(ctx context.Context) error {
	select {
	case rw.turn <- struct{}{}:
	default:
		return rw.errorf("try lock", ErrLocked)
	}
	rw.mu.Lock()
	readers := len(rw.groups) > 0
	rw.mu.Unlock()
	if readers {
		<-rw.turn
		return rw.errorf("try lock", ErrLocked)
	}
	h, err := rw.q.TryAcquire(ctx, writeSpec)
	if err != nil {
		<-rw.turn
		return rw.errorf("try lock", err)
	}
	rw.mu.Lock()
	rw.write = h
	rw.mu.Unlock()
	return nil
}

// Unlock releases the write lock: one Txn that deletes the key only while its create
// revision is still this hold's. It returns ErrNotLocked without a write hold, and ErrLost
// (the hold has ended all the same) if the hold was lost before. If etcd cannot be reached
// before ctx ends, the lock stays held and Unlock may be called again.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	rw.mu.Lock()
	h := rw.write
	rw.mu.Unlock()
	if h == nil {
		return rw.errorf("unlock", ErrNotLocked)
	}
	ended, err := h.Release(ctx)
	if ended {
		rw.mu.Lock()
		rw.write = nil
		rw.mu.Unlock()
		<-rw.turn
	}
	if err != nil {
		return rw.errorf("unlock", err)
	}
	return nil
}

// current is the write hold, else the newest read hold, else nil.
func (rw *RWMutex) current() *core.Hold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.write != nil {
		return rw.write
	}
	for _, g := range slices.Backward(rw.groups) {
		if g.hold != nil && g.members > 0 {
			return g.hold
		}
	}
	return nil
}

// Token is the fencing token of the write hold: its key's create revision, strictly
// increasing across the successive writers of the name. 0 without a write hold.
func (rw *RWMutex) Token() int64 {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.write.Token()
}

// Done is closed when the current hold ends: the write hold if this handle has one, else
// its newest read hold (shared by the readers of a group). Without a hold it is an already
// closed channel. The first call on a hold starts a watch of its key, as mutex.Mutex.Done.
func (rw *RWMutex) Done() <-chan struct{} {
	return rw.current().Done()
}

// Err is nil while the current hold (see Done) lasts, ErrLost once it was lost, and
// ErrNotLocked without a hold.
func (rw *RWMutex) Err() error {
	return rw.current().Err()
}

// IsOwner is a Txn compare that succeeds only while this handle's write hold lasts: put
// it in the If of every write the lock guards. Without a write hold it never succeeds.
// Readers have no such compare: a read hold does not exclude other readers.
func (rw *RWMutex) IsOwner() clientv3.Cmp {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.q.IsOwner(rw.write)
}

func (rw *RWMutex) errorf(op string, err error) error {
	return fmt.Errorf("rwmutex %q: %s: %w", rw.name, op, err)
}
