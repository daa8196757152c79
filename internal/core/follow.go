package core

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// What a barrier or a latch waits for is a state of a few keys (a round filled, a count at
// zero, a participant gone), not the order of a line: so each wait reads the state, and
// watches for its change from the revision after that read; after any gap in the watch
// (history compacted, a watch cancelled or refused by an auth change, a member without a
// leader, a broken stream) it reads the state again instead of trusting what it missed.
// A wait that begins after the state it waits for was reached returns after its read,
// whatever the revision is by then.
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

// follow watches key (a prefix too, with clientv3.WithPrefix in opts) from revision from
// and calls each with every event, in revision order, until each says done or fails, and
// returns what it said. It returns done false and no error when the watch ended first (a
// gap, see above): the caller reads the state again. stop, if not nil, ends the watch the
// same way when it closes. ctx's end returns ctx's error; a closed client ErrLost.
func follow(ctx context.Context, cli *clientv3.Client, key string, from int64, stop <-chan struct{},
	each func(*clientv3.Event) (done bool, err error), opts ...clientv3.OpOption) (done bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	w := cli.Watch(wctx, key, append([]clientv3.OpOption{clientv3.WithRev(from)}, opts...)...)
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	for {
		select {
		case <-probe.C:
			if rw := clockOf(cli).confirmEvery(ctx, cli, probeEvery); rw != nil {
				rewind(cli, rw)
				return false, fmt.Errorf("%w: %w", ErrLost, rw)
			}
		case resp, ok := <-w:
			if !ok || resp.Canceled || resp.Err() != nil {
				if err := waitErr(ctx, cli, nil); err != nil {
					return false, err
				}
				return false, nil
			}
			for _, ev := range resp.Events {
				if done, err := each(ev); done || err != nil {
					return done, err
				}
			}
		case <-stop:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}
