package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrGuard: an acquisition's Spec.Guard failed, so it wrote nothing. The caller reads what
// the guard compares and decides (a semaphore: record its limit, or ErrLimitMismatch).
var ErrGuard = errors.New("etcdsync: guard failed")

// try writes the keys only if no key is in spec.Ahead of any queue (and the guard holds):
// one Txn, ErrLocked (or ErrGuard) when it writes nothing.
//
// A try of a kind that waits behind every key of its names (Spec.Ahead "") needs no guard
// of its use: its compare that no key is there is stronger. When a key is, and the first
// of a name is of another use, it fails with ErrOtherKind instead of ErrLocked, at no cost.
func try[T any](ctx context.Context, a *acquisition, mk maker[T]) (T, error) {
	n, spec := len(a.qs), a.spec
	if spec.Ahead == "" {
		spec.Guard = spec.Guard[:len(spec.Guard)-a.useGuards]
	}
	var none T
	cmps := make([]clientv3.Cmp, 0, n+len(spec.Guard))
	then := make([]clientv3.Op, 0, n)
	orElse := make([]clientv3.Op, 0, 2*n+1)
	for i, q := range a.qs {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q.prefix+spec.Ahead), "=", 0).WithPrefix())
		then = append(then, clientv3.OpPut(a.slots[i].key(), spec.Value, clientv3.WithLease(a.sess.Lease())))
		orElse = append(orElse, clientv3.OpGet(a.slots[i].key()))
	}
	for _, q := range a.qs {
		// The keys may be there already (see write): they hold if each is first.
		orElse = append(orElse, clientv3.OpGet(q.prefix+spec.Ahead, clientv3.WithFirstCreate()...))
	}
	ans, err := a.write(ctx, func(t clientv3.Txn) clientv3.Txn {
		return t.If(append(cmps, spec.Guard...)...).Then(then...).Else(append(orElse, checkGuard(spec)...)...)
	})
	resp := ans.resp
	switch {
	case resp == nil:
		a.abandon(ctx, 0, ans.unknown)
		return none, tryError(ctx, a.describe(), err)
	case resp.Succeeded:
		return grant(ctx, a, ans.rev, err, mk)
	case ans.present == 0 && !guardHeld(resp, 2*n):
		a.abandon(ctx, 0, ans.unknown)
		return none, ErrGuard
	case ans.present == 0:
		a.abandon(ctx, 0, ans.unknown)
		if spec.Ahead == "" && len(a.claims) == n {
			for i, c := range a.claims {
				if head := resp.Responses[n+i].GetResponseRange().Kvs; len(head) > 0 && c.foreign(string(head[0].Key)) {
					return none, c.otherKind(string(head[0].Key))
				}
			}
		}
		return none, ErrLocked
	}
	if err != nil {
		return grant(ctx, a, ans.rev, err, mk) // removes the keys
	}
	first := ans.present == n // else another deleted some: cut short
	for i := range n {
		if head := resp.Responses[n+i].GetResponseRange().Kvs; len(head) > 0 && head[0].CreateRevision < ans.rev {
			first = false
		}
	}
	if !first {
		a.abandon(ctx, ans.rev, false) // ours, but behind another or cut short: a try does not wait
		return none, ErrLocked
	}
	return grant(ctx, a, ans.rev, a.takeOver(ctx, ans.own), mk)
}

// tryError is the error of a try that failed: ctx's error as it is, another wrapped.
func tryError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("try %s: %w", what, err)
}

// checkGuard is an Else op that evaluates spec.Guard, for guardHeld; none without a guard.
func checkGuard(spec Spec) []clientv3.Op {
	if len(spec.Guard) == 0 {
		return nil
	}
	return []clientv3.Op{clientv3.OpTxn(spec.Guard, nil, nil)}
}

// guardHeld reports whether the checkGuard op at index i of resp's ops succeeded; true when
// there is none (no guard).
func guardHeld(resp *clientv3.TxnResponse, i int) bool {
	if i >= len(resp.Responses) {
		return true
	}
	return resp.Responses[i].GetResponseTxn().GetSucceeded()
}

// countedTries is how often a try with several slots reads the count again after a key
// arrived between its read and its write, before it gives up as if every slot were taken.
const countedTries = 3

// tryCounted is TryAcquire for spec.slots() > 1 or spec.Passes (one queue): a hold only if
// fewer than spec.slots() keys (units, when weighted; those that count, with Passes) are
// in spec.Ahead, so that it is served at once
// and jumps no waiter. With capacity C an acquisition of weight n is served below C-n+1
// units ahead; a waiter of weight m waits behind at least C-m+1, so while there is one the
// range holds more than C units, and no try's count is under its threshold.
//
// A Txn cannot compare a count, so it reads first and writes on condition: one read-only
// Txn counts the range at revision R (and checks the guard); if a slot is free, a second
// puts the key only if no key of the range was written after R ("ModRevision < R+1" over a
// prefix holds for every key in it). Deletes since R only free slots. A key that arrived
// since R makes it read again, up to countedTries times, then give up with ErrNoPermits.
// When full it costs one read and writes nothing; otherwise a read and a Txn.
func tryCounted(ctx context.Context, a *acquisition) (*Hold, error) {
	for range countedTries {
		n, rev, err := a.qs[0].countKeys(ctx, a.spec)
		if err == nil && n >= a.spec.slots() {
			err = a.spec.full()
		}
		if err != nil {
			a.abandon(ctx, 0, false)
			return nil, err
		}
		h, err := a.putIfUnchanged(ctx, rev)
		if !errors.Is(err, errMoved) {
			return h, err
		}
	}
	a.abandon(ctx, 0, false)
	return nil, fmt.Errorf("%w: keys kept arriving between the count and the write", a.spec.full())
}

var errMoved = errors.New("etcdsync: a key arrived since the count")

// countKeys counts the keys in spec.Ahead, linearizably, under spec.Guard (ErrGuard if it
// fails), and returns the count with the revision it reflects. One read-only Txn, retried
// through leader changes.
func (q *Queue) countKeys(ctx context.Context, spec Spec) (n int, rev int64, err error) {
	w := weigherOf(q, spec)
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(spec.Guard...).
			Then(w.reads(q.prefix + spec.Ahead)...).
			Commit()
	})
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("count %s: %w", q.prefix+spec.Ahead, err)
	case !resp.Succeeded:
		return 0, 0, ErrGuard
	}
	return w.weight(resp.Responses), resp.Header.Revision, nil
}

// putIfUnchanged writes the key if no key of spec.Ahead was written after rev and the guard
// holds: then fewer than spec.slots() keys are ahead of it, as counted at rev. errMoved says
// a key arrived meanwhile (the slot is still claimed, nothing written). A key of the slot
// already there (see write) is taken over if it is served, else removed.
func (a *acquisition) putIfUnchanged(ctx context.Context, rev int64) (*Hold, error) {
	q, spec, key := a.qs[0], a.spec, a.slots[0].key()
	aheadRange := q.prefix + spec.Ahead
	cmps := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.ModRevision(aheadRange), "<", rev+1).WithPrefix(),
	}, spec.Guard...)
	ans, err := a.write(ctx, func(t clientv3.Txn) clientv3.Txn {
		return t.If(cmps...).
			Then(clientv3.OpPut(key, spec.Value, clientv3.WithLease(a.sess.Lease()))).
			Else(append([]clientv3.Op{clientv3.OpGet(key),
				clientv3.OpGet(aheadRange, weigherOf(q, spec).keys()...)}, checkGuard(spec)...)...)
	})
	resp := ans.resp
	switch {
	case resp == nil:
		a.abandon(ctx, 0, ans.unknown)
		return nil, tryError(ctx, key, err)
	case resp.Succeeded:
		return grant(ctx, a, ans.rev, err, newHoldOf)
	case ans.present == 1 && err != nil:
		return grant(ctx, a, ans.rev, err, newHoldOf) // removes it
	case ans.present == 1 && weigherOf(q, spec).ahead(resp.Responses[1].GetResponseRange().Kvs, ans.rev) < spec.slots():
		return grant(ctx, a, ans.rev, a.takeOver(ctx, ans.own), newHoldOf)
	case ans.present == 1:
		a.abandon(ctx, ans.rev, false) // ours, but not served: a try does not wait
		return nil, spec.full()
	case !guardHeld(resp, 2):
		a.abandon(ctx, 0, ans.unknown)
		return nil, ErrGuard
	case err != nil:
		a.abandon(ctx, 0, ans.unknown)
		return nil, err
	case ans.unknown:
		// A try got no answer and may still be applied: count no more on this slot.
		a.abandon(ctx, 0, true)
		return nil, fmt.Errorf("%w: a try of %s got no answer", spec.full(), key)
	}
	return nil, errMoved
}

// MaxNames is the most names one acquisition of several may take. Its Txn has two ops per
// name in each branch (a count and a put; a get and a read of the keys ahead), and etcd
// refuses a Txn with more than 128 ops in a branch by default (--max-txn-ops).
const MaxNames = 64

// maxRequestBytes is etcd's default limit on a request (--max-request-bytes, 1.5 MiB).
const maxRequestBytes = 3 << 19

// FitOneTxn reports, wrapped around ErrInvalidOption, why the names of qs cannot be taken
// in one Txn within etcd's default limits: too many names, or keys too long for the
// request size (which names and prefixes of the allowed lengths never reach: 64 names of
// 512 bytes, every byte escaped, under a 512-byte prefix, make about 700 KB).
func FitOneTxn(qs []*Queue, value string) error {
	if len(qs) == 0 || len(qs) > MaxNames {
		return fmt.Errorf("%w: %d names; one to %d", ErrInvalidOption, len(qs), MaxNames)
	}
	const keyTail = 16 + 1 + 20 // a lease in hex, '_', a slot's number
	const perOp = 32            // an op's framing, its lease, its options
	size := 0
	for _, q := range qs {
		key := len(q.prefix) + keyTail
		// The enqueue Txn: a compare, a count and a put; a get and a read of the name.
		size += 3*key + 2*len(q.prefix) + len(value) + 5*perOp
	}
	if size > maxRequestBytes/2 { // half: room for etcd's own framing and a bigger value
		return fmt.Errorf("%w: the keys of %d names take about %d bytes in one Txn, over half of etcd's default request limit (%d)",
			ErrInvalidOption, len(qs), size, maxRequestBytes)
	}
	return nil
}

// A ReleaseWatch tells a caller that retries a failed try when a key of the name has been
// deleted: a holder or a waiter let go, so the next try may succeed. It is a registration
// with the client's watch on the name, like a waiter's, and sends no RPC of its own.
//
// It is armed before each try and then waited on: Arm counts from every delete the watch
// has dispatched, which is never ahead of the revision at which the try that follows runs,
// so a release between the try and the wait is not missed. A delete the try already saw may
// wake it too; so may a watch that cannot tell what it missed (it just started, or etcd
// compacted its history): a spurious wake costs one more try, never a lost one.
//
// It is for one goroutine at a time. Registering never blocks: the watch is opened by the
// hub's own goroutine.
type ReleaseWatch struct {
	subs []releaseSub
	wake chan struct{} // every name's: what Arm returns
	once sync.Once
}

type releaseSub struct {
	h *hub
	w *releaseWatch
}

// WatchReleases registers a release watch for the deletes of keys in the sub-range kind of
// the name ("" for every kind). It is disarmed until Arm. Stop it when done.
func (q *Queue) WatchReleases(kind string) *ReleaseWatch {
	return WatchReleasesAll([]*Queue{q}, kind)
}

// WatchReleasesAll is WatchReleases for the names of several queues at once: a delete in any
// of them fires it. It is a registration with the client's watch on each name, all with one
// wake channel, and starts no goroutine.
func WatchReleasesAll(qs []*Queue, kind string) *ReleaseWatch {
	r := &ReleaseWatch{subs: make([]releaseSub, len(qs)), wake: make(chan struct{}, 1)}
	for i, q := range qs {
		w := &releaseWatch{prefix: q.prefix + kind, wake: r.wake}
		r.subs[i] = releaseSub{join(q.hubKey(), w), w}
	}
	return r
}

// WatchRelease is WatchReleases in the shape of package trylock's ReleaseWatcher: arm is
// Arm, stop is Stop.
func (q *Queue) WatchRelease(kind string) (arm func() <-chan struct{}, stop func()) {
	r := q.WatchReleases(kind)
	return r.Arm, r.Stop
}

// Arm starts a new round: the returned channel yields once a key of the watch's kind is
// deleted at a revision after every delete dispatched so far (or when the watch cannot tell,
// see ReleaseWatch). It forgets the rounds before; the channel is the same every round and
// yields at most once per round.
func (r *ReleaseWatch) Arm() <-chan struct{} {
	select {
	case <-r.wake:
	default:
	}
	for _, s := range r.subs {
		s.h.mu.Lock()
		// 0 before the watch has started: its start then counts as a release (catchUp),
		// since it may start after the try and so after a release that the try did not see.
		s.w.armed, s.w.snap = true, s.h.dispatched()
		s.h.mu.Unlock()
	}
	return r.wake
}

// Stop ends the registration; only the first call counts.
func (r *ReleaseWatch) Stop() {
	r.once.Do(func() {
		for _, s := range r.subs {
			s.h.leave(s.w)
		}
	})
}

// releaseWatch is a ReleaseWatch as its hub sees it. Its fields are guarded by the hub's
// mutex.
type releaseWatch struct {
	prefix string
	wake   chan struct{}
	armed  bool
	snap   int64
}

// since is the armed round's start; a disarmed watch wants no event, and no replay.
func (w *releaseWatch) since() int64 {
	if !w.armed {
		return math.MaxInt64
	}
	return w.snap
}

func (w *releaseWatch) apply(_ int64, evs []event) {
	for _, e := range evs {
		// A change of a key's mode (see mode.go) may let the next try in too.
		if (!e.put || e.changed) && strings.HasPrefix(e.key, w.prefix) {
			w.fire()
			return
		}
	}
}

// missed counts as a release: the watch cannot know whether one went by.
func (w *releaseWatch) missed() { w.fire() }

func (w *releaseWatch) stale() bool { return false }

func (w *releaseWatch) recount([]*mvccpb.KeyValue, int64) {}

// fail wakes the caller, whose next try then meets what failed.
func (w *releaseWatch) fail(error) { w.fire() }

func (w *releaseWatch) fire() {
	if w.armed {
		w.armed = false
		signal(w.wake)
	}
}
