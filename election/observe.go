package election

import (
	"context"
	"errors"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Leader is who leads an election: the value the leader campaigned with or proclaimed
// last, and its Token (its key's create revision). The zero Leader means nobody leads.
type Leader struct {
	Value string
	Token int64
}

// Leader returns the current leader, read linearizably, retried through leader changes of
// etcd until ctx ends.
//
// Errors: [ErrNoLeader] when nobody leads. ctx's error with ctx done already.
// [ErrInvalidOption]: e was not made by [New], or its client is closed.
//
// Cost: one Range.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if err := e.shell().Check("leader"); err != nil {
		return Leader{}, err
	}
	hd, err := e.s.Q.Head(ctx)
	switch {
	case err != nil:
		return Leader{}, e.errorf("leader", err)
	case hd.Token == 0:
		return Leader{}, e.errorf("leader", ErrNoLeader)
	}
	return Leader{Value: hd.Value, Token: hd.Token}, nil
}

// Observe follows the election: the channel first yields the current leader ([Leader]{}
// when nobody leads), then every change of leader or of its value, in the order etcd applied
// them, each once, and Leader{} whenever nobody leads. It rides out leader changes of etcd,
// members that apply behind, and compaction (the observer then reads the election again and
// sends what changed), and a cluster that went back in time (restored from an older snapshot:
// it starts over and sends the leader as it is now). It closes when ctx ends, when the client is closed, or when etcd
// refuses to let this client read the name (no read permission, or revoked), which
// [Election.Leader] then reports as an error; at once on an Election not made by [New] or
// through a closed client, and with ctx done already, having yielded at most the current
// leader.
//
// A reader that keeps up sees every change. One that lags keeps up to 128 changes queued;
// past that it skips the oldest, so it may miss intermediate values, but never sees them out
// of order and always ends with the latest.
//
// Cost: the observers of one client share one watch of the name, and one read of the
// cluster's revision (a count of no key) every 5 s, which is how a client that only
// observes notices the cluster going back in time.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	if e.shell().Check("observe") != nil {
		close(ch)
		return ch
	}
	o := e.s.Q.WatchHead()
	go func() {
		defer close(ch)
		defer func() { o.Stop() }()
		for {
			hd, err := o.Next(ctx)
			if errors.Is(err, core.ErrRewound) && ctx.Err() == nil {
				// What it followed is void: start over from the election as it is now.
				o.Stop()
				o = e.s.Q.WatchHead()
				continue
			}
			if err != nil {
				return // ctx ended, or the client closed
			}
			select {
			case ch <- Leader{Value: hd.Value, Token: hd.Token}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}
