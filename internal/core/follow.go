package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
	resp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
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
	return followAll(ctx, cli, []watched{{key, opts}}, stop, check, each)
}

// watched is a key (or a range, by its opts) that a wait follows.
type watched struct {
	key  string
	opts []clientv3.OpOption
}

// followAll is follow over several keys or ranges at once: every watch is placed before the
// read, and an event of any of them is judged.
func followAll(ctx context.Context, cli *clientv3.Client, ws []watched, stop <-chan struct{},
	check func() (rev int64, v verdict, err error),
	each func(*clientv3.Event) (verdict, error)) (bool, error) {
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	var b backoff
	for {
		ok, gap, err := followOnce(ctx, cli, ws, stop, probe.C, check, each)
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

// followOnce is one watch of each of ws: gap says that it ended with neither a verdict nor
// an error, and new watches are due.
func followOnce(ctx context.Context, cli *clientv3.Client, ws []watched, stop <-chan struct{}, probe <-chan time.Time,
	check func() (int64, verdict, error), each func(*clientv3.Event) (verdict, error)) (ok, gap bool, err error) {
	var forwarders sync.WaitGroup
	defer forwarders.Wait()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	type answer struct {
		resp clientv3.WatchResponse
		open bool
	}
	// The watches' responses, in one channel: each watch's in its order, which is all the
	// discipline needs (an event at or before the read is skipped, whichever watch it
	// came from).
	answers := make(chan answer)
	for _, w := range ws {
		ch := cli.Watch(wctx, w.key, append([]clientv3.OpOption{clientv3.WithCreatedNotify()}, w.opts...)...)
		forwarders.Add(1)
		go func() {
			defer forwarders.Done()
			for resp := range ch {
				select {
				case answers <- answer{resp, true}:
				case <-wctx.Done():
					return
				}
			}
			select {
			case answers <- answer{open: false}:
			case <-wctx.Done():
			}
		}()
	}
	unplaced := len(ws)
	var read int64 = -1 // the revision of the last check; -1 before every watch is placed
	for {
		select {
		case <-probe:
			if rw := clockOf(cli).confirmEvery(ctx, cli, probeEvery); rw != nil {
				rewind(cli, rw)
				return false, false, fmt.Errorf("%w: %w", ErrLost, rw)
			}
		case a := <-answers:
			resp := a.resp
			if !a.open || resp.Canceled || resp.Err() != nil {
				return false, true, waitErr(ctx, cli, nil)
			}
			if resp.Created {
				unplaced--
			}
			if read < 0 && unplaced > 0 {
				continue // a watch's event before every watch is placed: the read sees it
			}
			if read < 0 { // placed: their events are those after their creation, and the read follows
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

// awaitGone is the one wait for a key to go: it returns true once the key of kv is gone
// (deleted, or created again since: its create revision is another), or, with changed, also
// once it was written again (its mod revision is another); false, with nil, when stop closed
// first. follow's watch-then-read: a gap in the watch is followed by a read, never trusted.
// Errors: ctx's when ctx ends; ErrLost when the client is closed or the cluster went back in
// time. Cost: a watch of the key and one Range, again after each gap.
func awaitGone(ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, stop <-chan struct{}, changed bool) (bool, error) {
	key := string(kv.Key)
	var opts []clientv3.OpOption
	if !changed {
		opts = append(opts, clientv3.WithFilterPut())
	}
	check := func() (int64, verdict, error) {
		get := []clientv3.OpOption{clientv3.WithKeysOnly()}
		resp, err := readState(ctx, cli, clientv3.OpGet(key, get...))
		if err != nil {
			return 0, stillWaiting, err
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != kv.CreateRevision || changed && kvs[0].ModRevision != kv.ModRevision {
			return resp.Header.Revision, waitOver, nil
		}
		return resp.Header.Revision, stillWaiting, nil
	}
	each := func(*clientv3.Event) (verdict, error) { return waitOver, nil } // a delete, or with changed a put
	return follow(ctx, cli, key, stop, check, each, opts...)
}
