package core

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// What a barrier or a latch waits for is a state of a few keys (a round filled, a count at
// zero, a participant gone), not the order of a line. So a wait places a watch of those keys
// from the present, then reads the state, and from then on takes the events after its read
// (those at or before it are in the read already); after any gap in the watch (history
// compacted, a watch cancelled or refused by an auth change, a member without a leader, a
// broken stream) it places a new watch and reads again instead of trusting what it missed.
// A wait that begins after the state it waits for was reached returns after its read,
// whatever the revision is by then. The watch is placed before the read, not from the
// revision after it: a watch from a past revision is served only by etcd's resync loop,
// every 100 ms, which would delay every wait on a name being written to.
//
// A watch that the client resumes after a member restarted goes on from the revision after
// the last it delivered; if the cluster went back in time (a restore), that revision is
// ahead of the cluster's, and the watch waits silently for it, past every change in
// between. So a wait also reads the cluster's revision every probeEvery (one read per
// client for all its waits, see clock.confirmEvery), as a hub of observers does.

// readState reads ops in one Txn, a linearizable snapshot, retried through leader changes.
// If the cluster went back in time (see clock.go), it rewinds the client and returns
// ErrLost wrapping why.
func readState(ctx context.Context, cli *clientv3.Client, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	var sent int64
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		sent = clockOf(cli).now()
		return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
	})
	if err != nil {
		return nil, waitErr(ctx, cli, err)
	}
	if err := settleLinear(cli, resp.Header, sent); err != nil {
		return nil, err
	}
	return resp, nil
}

// waitErr is the error of a wait whose request failed with err: ctx's own error when ctx
// ended, ErrLost when the client was closed under it, else err.
func waitErr(ctx context.Context, cli *clientv3.Client, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case cli.Ctx().Err() != nil:
		return fmt.Errorf("%w: %w", ErrLost, errClientClosed)
	}
	return err
}

// A verdict is what a wait makes of the state it read, or of an event.
type verdict int

const (
	stillWaiting verdict = iota // not yet: go on watching
	waitOver                    // the wait is over
	readAgain                   // the event says too little: read the state again
)

// follow is a wait on key (a prefix too, with clientv3.WithPrefix in opts), as above: check
// reads the state and returns the revision it read at and its verdict (stillWaiting or
// waitOver); each judges an event after that revision (readAgain calls check again, on the
// same watch). It returns true once a verdict is waitOver, false when stop closed first (the caller reads
// what stopped it); ctx's error when ctx ends; ErrLost when the client is closed or the
// cluster went back in time; the error of check or each.
func follow(ctx context.Context, cli *clientv3.Client, key string, stop <-chan struct{},
	check func() (rev int64, v verdict, err error),
	each func(*clientv3.Event) (verdict, error), opts ...clientv3.OpOption) (bool, error) {
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	var b backoff
	for {
		ok, gap, err := followOnce(ctx, cli, key, stop, probe.C, check, each, opts)
		if !gap || err != nil {
			return ok, err
		}
		// A watch refused at once (an auth change in flight, no leader) is placed again
		// after a pause, not in a loop.
		if err := b.wait(ctx); err != nil {
			return false, err
		}
	}
}

// followOnce is one watch of follow: gap says that it ended with neither a verdict nor an
// error, and a new watch is due.
func followOnce(ctx context.Context, cli *clientv3.Client, key string, stop <-chan struct{}, probe <-chan time.Time,
	check func() (int64, verdict, error), each func(*clientv3.Event) (verdict, error), opts []clientv3.OpOption) (ok, gap bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	w := cli.Watch(wctx, key, append([]clientv3.OpOption{clientv3.WithCreatedNotify()}, opts...)...)
	var read int64 = -1 // the revision of the last check; -1 before the watch is placed
	for {
		select {
		case <-probe:
			if rw := clockOf(cli).confirmEvery(ctx, cli, probeEvery); rw != nil {
				rewind(cli, rw)
				return false, false, fmt.Errorf("%w: %w", ErrLost, rw)
			}
		case resp, open := <-w:
			if !open || resp.Canceled || resp.Err() != nil {
				return false, true, waitErr(ctx, cli, nil)
			}
			if read < 0 { // placed: its events are those after its creation, and the read follows
				rev, v, err := check()
				if v == waitOver || err != nil {
					return v == waitOver, false, err
				}
				read = rev
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision <= read {
					continue // the read saw it
				}
				v, err := each(ev)
				if v == readAgain && err == nil {
					read, v, err = check()
				}
				if v == waitOver || err != nil {
					return v == waitOver, false, err
				}
			}
		case <-stop:
			return false, false, nil
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
	}
}
