package core

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An acquisition of several names (mutex.Multi) is the queue's own, over several queues at
// once: one Txn writes a key under every name, so that all of them share one create
// revision, and the Group is served once no name has a key ahead of its own. Any two such
// acquisitions are in the same order on every name they share (the order of their
// revisions), so no cycle of waits can form, and a single mutex on any of the names queues
// with them as with anyone. Each name's wait is a queueWaiter on the client's hub of that
// name; the Group's members are ordinary Holds, released together by one fenced Txn.

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

// AcquireAll enqueues one key on every queue of qs, in one Txn, and waits until no key is
// ahead of any of them; then it returns the Group of the keys. The queues must share one
// client and one session source, and spec must be exclusive (Capacity and Weight 1, no
// Guard). onKeys, if not nil, learns the keys before the wait. Uncontended it costs one
// Txn; a waiter joins the client's hub of each name it waits on. On failure, including ctx
// ending, it deletes its keys in one fenced Txn before returning, or, if etcd cannot be
// reached within a second, in the background (see janitor).
func AcquireAll(ctx context.Context, qs []*Queue, spec Spec, onKeys func([]string)) (*Group, error) {
	return withSession(ctx, qs[0].sessions, func(sess *Session) (*Group, error) {
		slots := claimSlots(qs, spec.keyKind(), sess)
		if onKeys != nil {
			onKeys(keysOf(slots))
		}
		e, err := enqueueAll(ctx, sess, qs, spec, slots)
		if e.rev == 0 {
			abandonAll(ctx, qs[0].cli, slots, 0, e.unknown)
			return nil, err
		}
		if err == nil {
			spec.Tel.enqueued(ctx, e.most(), e.rev)
		}
		if err == nil && e.most() >= spec.slots() {
			err = waitAll(ctx, sess, qs, spec, slots, e)
		}
		return grantAll(ctx, sess, qs[0].cli, slots, e.rev, err)
	})
}

// claimSlots claims a slot under every queue of qs on sess's lease.
func claimSlots(qs []*Queue, kind string, sess *Session) []*slot {
	slots := make([]*slot, len(qs))
	for i, q := range qs {
		slots[i] = claimSlot(q.prefix, kind, sess)
	}
	return slots
}

func keysOf(slots []*slot) []string {
	keys := make([]string, len(slots))
	for i, sl := range slots {
		keys[i] = sl.key()
	}
	return keys
}

// describe names the keys of slots in an error: the first, and how many more.
func describe(slots []*slot) string {
	if len(slots) == 1 {
		return slots[0].key()
	}
	return fmt.Sprintf("%s and %d more", slots[0].key(), len(slots)-1)
}

// enqueuedAll is what enqueueAll learned: the keys' one create revision (0 if none is known
// to have been written), the revision the counts reflect, and how many keys are ahead on
// each name.
type enqueuedAll struct {
	rev, snap int64
	ahead     []int
	unknown   bool // with rev 0: a try got no answer, so the keys may have been written
}

// most is the largest count ahead of the keys.
func (e enqueuedAll) most() int {
	n := 0
	for _, a := range e.ahead {
		n = max(n, a)
	}
	return n
}

// enqueueAll writes the keys of slots once, whatever the retries, in one Txn that also
// counts the keys ahead on every name, and returns what it learned (see enqueue).
func enqueueAll(ctx context.Context, sess *Session, qs []*Queue, spec Spec, slots []*slot) (enqueuedAll, error) {
	cli, n := qs[0].cli, len(qs)
	cmps := make([]clientv3.Cmp, 0, n)
	then := make([]clientv3.Op, 0, 2*n)
	orElse := make([]clientv3.Op, 0, 2*n)
	for i, q := range qs {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(slots[i].key()), "=", 0))
		// Every count before every put: each key there is ahead.
		then = append(then, clientv3.OpGet(q.prefix+spec.Ahead, clientv3.WithPrefix(), clientv3.WithCountOnly()))
		orElse = append(orElse, clientv3.OpGet(slots[i].key()))
	}
	for i, q := range qs {
		then = append(then, clientv3.OpPut(slots[i].key(), spec.Value, clientv3.WithLease(sess.Lease())))
		orElse = append(orElse, clientv3.OpGet(q.prefix+spec.Ahead, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	before := clockOf(cli).now() // every key this call writes is created after it
	res, err := commitWrite(ctx, cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(cmps...).Then(then...).Else(orElse...)
	})
	if res.unknown {
		qs[0].sessions.Retire(sess) // see Queue.abandon
	}
	resp := res.resp
	switch {
	case resp == nil && ctx.Err() != nil:
		return enqueuedAll{unknown: res.unknown}, ctx.Err()
	case resp == nil:
		return enqueuedAll{unknown: res.unknown}, fmt.Errorf("enqueue %s: %w", describe(slots), err)
	case resp.Succeeded:
		e := enqueuedAll{rev: resp.Header.Revision, snap: resp.Header.Revision, ahead: make([]int, n)}
		for i := range n {
			e.ahead[i] = int(resp.Responses[i].GetResponseRange().Count)
		}
		return e, err
	}
	// Some key of the slots is there already: written by a try of this call whose answer
	// was lost, or late. The Txn wrote all or none of them, at one revision.
	own := make([]*mvccpb.KeyValue, n)
	var rev int64
	present := 0
	for i := range n {
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
			own[i], rev = kvs[0], kvs[0].CreateRevision
			present++
		}
	}
	switch {
	case present == 0:
		return enqueuedAll{unknown: res.unknown}, fmt.Errorf("%w: keys %s vanished inside a Txn", ErrLost, describe(slots))
	case rev <= before:
		// See enqueue: a key of an older life of the cluster is never adopted.
		err := fmt.Errorf("%w: key of %s came back at create revision %d, before revision %d seen already", ErrRewound, describe(slots), rev, before)
		rewind(cli, err)
		return enqueuedAll{rev: rev}, fmt.Errorf("%w: %w", ErrLost, err)
	case present < n:
		// Another deleted some of the keys this call wrote before it learned it had.
		return enqueuedAll{rev: rev}, fmt.Errorf("%w: %d of the keys %s deleted while enqueuing", ErrLost, n-present, describe(slots))
	}
	e := enqueuedAll{rev: rev, snap: resp.Header.Revision, ahead: make([]int, n)}
	for i := range n {
		for _, kv := range resp.Responses[n+i].GetResponseRange().Kvs {
			if kv.CreateRevision < rev {
				e.ahead[i]++
			}
		}
	}
	for i := 0; i < n && err == nil; i++ {
		err = qs[i].takeOver(ctx, sess, own[i], spec.Value)
	}
	return e, err
}

// waitAll returns once no key is ahead of any of the keys of slots, counting the deletes the
// hubs of the names it waits on dispatch; ErrLost when one of those keys or the session goes
// first. Names with nothing ahead are not watched: a later delete of their key is the
// Group's loss, which its watch (from the create revision on) reports. It sends no RPC
// itself.
func waitAll(ctx context.Context, sess *Session, qs []*Queue, spec Spec, slots []*slot, e enqueuedAll) error {
	type waiting struct {
		h *hub
		w *queueWaiter
	}
	wake := make(chan struct{}, 1) // one for every waiter: each signal makes the loop look at all
	var subs []waiting
	defer func() {
		for _, s := range subs {
			s.h.leave(s.w)
		}
	}()
	for i, q := range qs {
		if e.ahead[i] < spec.slots() {
			continue
		}
		w := newQueueWaiter(slots[i].key(), e.rev, e.snap, e.ahead[i], q.prefix+spec.Ahead, spec.slots())
		w.wake = wake
		subs = append(subs, waiting{join(q.hubKey(), w), w})
	}
	for {
		pending := false
		for _, s := range subs {
			s.h.mu.Lock()
			done, err := s.w.outcome()
			s.h.mu.Unlock()
			if err != nil {
				return err
			}
			pending = pending || !done
		}
		if !pending {
			return nil
		}
		select {
		case <-wake:
		case <-sess.Done():
			return sess.lostErr()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// grantAll makes the Group of the keys of slots written at rev, unless the acquisition
// failed (err) or its session ended meanwhile (see Queue.grant); the keys are then removed.
func grantAll(ctx context.Context, sess *Session, cli *clientv3.Client, slots []*slot, rev int64, err error) (*Group, error) {
	if err == nil {
		err = sess.lostErr()
	}
	if err == nil {
		err = clockOf(cli).above(rev)
	}
	if err != nil {
		abandonAll(ctx, cli, slots, rev, false)
		return nil, err
	}
	return newGroup(cli, sess, slots, rev), nil
}

// abandonAll is Queue.abandon for the keys of slots, written together at rev (0: unknown
// whether they were; unknown: one try got no answer): one fenced Txn for all of them.
func abandonAll(ctx context.Context, cli *clientv3.Client, slots []*slot, rev int64, unknown bool) {
	if rev == 0 && !unknown {
		for _, sl := range slots {
			sl.free()
		}
		return
	}
	c := &keysCleanup{cli: cli, slots: slots, revs: make([]int64, len(slots)), known: rev != 0}
	for i := range c.revs {
		c.revs[i] = rev
	}
	dctx, cancel := detached(ctx, cleanupWait)
	done := c.attempt(dctx)
	cancel()
	if !done {
		janitorOf(cli).add(c)
	}
}

// keysCleanup is keyCleanup for the keys of an acquisition of several names: their slots
// stay claimed until the keys are known to be gone.
type keysCleanup struct {
	cli   *clientv3.Client
	slots []*slot
	revs  []int64 // each key's create revision; 0 for a key known to be absent
	known bool    // revs are known; else they are read first
}

// attempt deletes the keys in one Txn, each fenced on its create revision (read first in
// one Txn if not known), so that it never takes a later key of the same slots.
func (c *keysCleanup) attempt(ctx context.Context) bool {
	if !c.known {
		reads := make([]clientv3.Op, len(c.slots))
		for i, sl := range c.slots {
			reads[i] = clientv3.OpGet(sl.key(), clientv3.WithKeysOnly())
		}
		resp, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(reads...).Commit()
		if err != nil {
			return c.refused(err)
		}
		for i := range c.slots {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
				c.revs[i] = kvs[0].CreateRevision
			}
		}
		c.known = true
	}
	var deletes []clientv3.Op
	for i, sl := range c.slots {
		if c.revs[i] != 0 {
			deletes = append(deletes, fencedDelete(sl.key(), c.revs[i]))
		}
	}
	if len(deletes) > 0 {
		if _, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(deletes...).Commit(); err != nil {
			return c.refused(err)
		}
	}
	c.drop() // deleted now, or gone before
	return true
}

// refused ends the chore if etcd refused it for good (see keyCleanup.refused).
func (c *keysCleanup) refused(err error) bool {
	if refused(err) {
		c.drop()
		return true
	}
	return false
}

func (c *keysCleanup) drop() {
	for _, sl := range c.slots {
		sl.free()
	}
}

// fencedDelete is an op that deletes key only if its create revision is rev: a nested Txn,
// so that one Txn can release several keys and say which of them it deleted.
func fencedDelete(key string, rev int64) clientv3.Op {
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)},
		[]clientv3.Op{clientv3.OpDelete(key)}, nil)
}

// TryAcquireAll takes the Group of qs only if no name has a key: one Txn, which writes
// nothing otherwise, and ErrLocked. The queues and spec are as for AcquireAll.
func TryAcquireAll(ctx context.Context, qs []*Queue, spec Spec) (*Group, error) {
	return withSession(ctx, qs[0].sessions, func(sess *Session) (*Group, error) {
		return tryAll(ctx, sess, qs, spec, claimSlots(qs, spec.keyKind(), sess))
	})
}

func tryAll(ctx context.Context, sess *Session, qs []*Queue, spec Spec, slots []*slot) (*Group, error) {
	cli, n := qs[0].cli, len(qs)
	cmps := make([]clientv3.Cmp, 0, n)
	then := make([]clientv3.Op, 0, n)
	orElse := make([]clientv3.Op, 0, 2*n)
	for i, q := range qs {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q.prefix+spec.Ahead), "=", 0).WithPrefix())
		then = append(then, clientv3.OpPut(slots[i].key(), spec.Value, clientv3.WithLease(sess.Lease())))
		orElse = append(orElse, clientv3.OpGet(slots[i].key()))
	}
	for _, q := range qs {
		// The keys may be there already (see enqueue): they hold if each is first.
		orElse = append(orElse, clientv3.OpGet(q.prefix+spec.Ahead, clientv3.WithFirstCreate()...))
	}
	res, err := commitWrite(ctx, cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(cmps...).Then(then...).Else(orElse...)
	})
	if res.unknown {
		qs[0].sessions.Retire(sess) // see Queue.abandon
	}
	resp := res.resp
	switch {
	case resp == nil:
		abandonAll(ctx, cli, slots, 0, res.unknown)
		return nil, tryError(ctx, describe(slots), err)
	case resp.Succeeded:
		return grantAll(ctx, sess, cli, slots, resp.Header.Revision, err)
	}
	own := make([]*mvccpb.KeyValue, n)
	var rev int64
	first := true
	for i := range n {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			first = false
			continue
		}
		own[i], rev = kvs[0], kvs[0].CreateRevision
		if head := resp.Responses[n+i].GetResponseRange().Kvs; len(head) > 0 && head[0].CreateRevision < rev {
			first = false
		}
	}
	switch {
	case rev == 0:
		abandonAll(ctx, cli, slots, 0, res.unknown)
		return nil, ErrLocked
	case !first:
		abandonAll(ctx, cli, slots, rev, false) // ours, but behind another or cut short: a try does not wait
		return nil, ErrLocked
	}
	for i := 0; i < n && err == nil; i++ {
		err = qs[i].takeOver(ctx, sess, own[i], spec.Value)
	}
	return grantAll(ctx, sess, cli, slots, rev, err)
}
