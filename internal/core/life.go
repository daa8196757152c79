package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hold's life beyond its lease: how long it may last (WithMaxHold), and how long a waiter
// waits after a predecessor that did not let go (WithLockDelay).
//
// A maximum hold is a timer per hold, armed at the grant (no goroutine until it fires):
// when it fires the hold ends as lost with ErrMaxHold, so that Done closes and a Do's ctx
// ends before the key goes, and then its key is deleted, fenced on its create revision, at
// once or by the janitor. Until the key is known gone the slot stays claimed, and a Release
// deletes the key as it does a hold's that could not be watched (keyMayRemain).

// ErrMaxHold: the hold passed its maximum (WithMaxHold) and ended by itself; its key was
// removed. A loss: errors.Is(err, ErrLost) holds too.
var ErrMaxHold = errors.New("etcdsync: the maximum hold passed")

// life is what a queue's options say of its holds' life.
type life struct {
	maxHold   time.Duration // 0: no maximum
	lockDelay time.Duration
}

func lifeOf(c Config) life { return life{maxHold: c.MaxHold, lockDelay: c.LockDelay} }

// bound arms the maximum hold of what an acquisition of the queues granted: a Hold, or
// each member of a Group.
func bound[T any](qs []*Queue, t T) {
	d := qs[0].life.maxHold
	if d <= 0 {
		return
	}
	switch t := any(t).(type) {
	case *Hold:
		t.bound(d)
	case *Group:
		for _, h := range t.members {
			h.bound(d)
		}
	}
}

// bound has the hold end by itself d from now (see expire).
func (h *Hold) bound(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held {
		h.timer = time.AfterFunc(d, func() { h.expire(d) })
	}
}

// expire ends the hold whose maximum hold d passed, as lost, then deletes its key. A hold
// being released is looked at again a second later: its release may fail and leave it held.
func (h *Hold) expire(d time.Duration) {
	h.mu.Lock()
	switch h.state {
	case releasing:
		h.timer = time.AfterFunc(time.Second, func() { h.expire(d) })
		h.mu.Unlock()
		return
	case held:
		h.end(lost, fmt.Errorf("%w: key %s: %w (%v)", ErrLost, h.key, ErrMaxHold, d))
		h.mu.Unlock()
	default:
		h.mu.Unlock()
		return
	}
	if h.cli.Ctx().Err() != nil {
		return // the key goes with its lease, which nobody renews
	}
	c := &keysCleanup{cli: h.cli, slots: []*slot{h.slot}, revs: []int64{h.rev}, known: true}
	ctx, cancel := context.WithTimeout(h.cli.Ctx(), cleanupWait)
	done := c.attempt(ctx)
	cancel()
	if !done {
		janitorOf(h.cli).add(c)
	}
}

// lockDelay waits, when a predecessor of the waiter's keys went with its lease, until the
// lock-delay has passed since that was seen. served says what served each of its names:
// the delete of a key of a lease, which went with it if etcd says the lease is gone (a
// release leaves it); or a read, after which the keys that went are found in etcd's
// history (one Txn of two Ranges at past revisions), all of whose leases are looked at;
// if the history was compacted, the waiter cannot tell, and waits. One LeaseTimeToLive per
// lease, bounded by cleanupWait; one that gets no answer counts as gone.
func (a *acquisition) lockDelay(ctx context.Context, served []servedBy) error {
	var since time.Time
	for _, s := range served {
		leases, known := []int64{s.lease}, s.known
		if !known {
			leases, known = wentBetween(ctx, a.cli(), s)
		}
		went := !known
		for _, l := range leases {
			went = went || l != 0 && leaseEnded(ctx, a.cli(), l)
		}
		if went && s.at.After(since) {
			since = s.at
		}
	}
	if since.IsZero() {
		return nil
	}
	t := time.NewTimer(time.Until(since.Add(a.qs[0].life.lockDelay)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-a.sess.Done():
		return a.sess.lostErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wentBetween returns the leases of the keys of s.prefix created before s.rev that were
// there at revision s.from and not at s.to; known is false when etcd no longer has that
// history or does not answer within cleanupWait.
func wentBetween(ctx context.Context, cli *clientv3.Client, s servedBy) (leases []int64, known bool) {
	ctx, cancel := context.WithTimeout(ctx, cleanupWait)
	defer cancel()
	at := func(rev int64) clientv3.Op {
		// Not keys only: etcd 3.7 answers those from its index, without the lease.
		return clientv3.OpGet(s.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithMaxCreateRev(s.rev-1))
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(at(s.from), at(s.to)).Commit()
	if err != nil {
		return nil, false
	}
	now := make(map[string]int64)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		now[string(kv.Key)] = kv.CreateRevision
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if now[string(kv.Key)] != kv.CreateRevision {
			leases = append(leases, kv.Lease)
		}
	}
	return leases, true
}

// leaseEnded reports whether etcd says lease is gone, or does not answer within
// cleanupWait.
func leaseEnded(ctx context.Context, cli *clientv3.Client, lease int64) bool {
	ctx, cancel := context.WithTimeout(ctx, cleanupWait)
	defer cancel()
	resp, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), clientv3.LeaseID(lease))
	return err != nil || resp.TTL < 0
}

// keyMayRemain reports whether a hold that ended with err may still have its key, which
// its Release then deletes: one that could not be watched, or whose maximum hold passed.
func keyMayRemain(err error) bool {
	return errors.Is(err, errUnwatched) || errors.Is(err, ErrMaxHold)
}
