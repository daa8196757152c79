package core

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A gate (a barrier's simple form, etcd's recipe Barrier) is one key "<name>/gate" without
// a lease: waiters pass while it is absent. Hold creates it, Release deletes it; a wait
// reads it, and watches it for its delete (see follow.go).

// gateKey is a gate's key under its name's prefix.
const gateKey = "gate"

// Gate is the gate of a name.
type Gate struct {
	q   *Queue
	key string
}

// NewGate returns the gate of name, configured by c. It does no I/O.
func NewGate(cli *clientv3.Client, c Config, name string) *Gate {
	q := NewQueue(cli, c, name)
	return &Gate{q: q, key: q.prefix + gateKey}
}

// Queue is the gate's queue (its name and client).
func (g *Gate) Queue() *Queue { return g.q }

// Hold closes the gate: it creates its key, if absent. One Txn, retried through leader
// changes.
func (g *Gate) Hold(ctx context.Context) error {
	if _, err := Record(ctx, g.q.cli, Claim{g.q.prefix, UseGate}, g.key, OwnerValue("")); err != nil {
		return waitErr(ctx, g.q.cli, err)
	}
	return nil
}

// Release opens the gate: it deletes its key. One delete, retried through leader changes.
func (g *Gate) Release(ctx context.Context) error {
	if _, err := retry(ctx, func(ctx context.Context) (*clientv3.DeleteResponse, error) {
		return g.q.cli.Delete(clientv3.WithRequireLeader(ctx), g.key)
	}); err != nil {
		return waitErr(ctx, g.q.cli, err)
	}
	return nil
}

// Wait returns once the gate is open: at once if its key is absent when read.
func (g *Gate) Wait(ctx context.Context) error {
	_, err := follow(ctx, g.q.cli, g.key, nil, func() (int64, verdict, error) {
		resp, err := readState(ctx, g.q.cli, clientv3.OpGet(g.key, clientv3.WithCountOnly()))
		switch {
		case err != nil:
			return 0, stillWaiting, err
		case resp.Responses[0].GetResponseRange().Count == 0:
			return resp.Header.Revision, waitOver, nil
		}
		return resp.Header.Revision, stillWaiting, nil
	}, func(ev *clientv3.Event) (verdict, error) {
		if ev.Type == clientv3.EventTypeDelete {
			return waitOver, nil
		}
		return stillWaiting, nil
	})
	return err
}
