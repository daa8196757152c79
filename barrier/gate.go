package barrier

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Gate is a barrier's simple form (etcd's recipe Barrier): one process holds it, any
// number wait until it is released. It is one key "<name>/gate" without a lease: a gate
// held stays held, whatever becomes of the process that held it, until a Release. A Wait
// while it is not held returns at once: hold it before the waiters start, or use a
// countdown latch (package latch), whose waiters wait for its Set.
//
// Only [NewGate] makes a usable Gate: every method of the zero Gate and of a nil *Gate
// returns [ErrInvalidOption] at once, as does every call through a closed client.
//
// It is one key without a lease, "<name>/gate" (core.GateKey): Hold creates it, Release
// deletes it; a wait reads it, and watches it for its delete (core.Follow).
type Gate struct {
	s   core.Shell
	q   *core.Queue
	key string
}

// NewGate returns the Gate on name over cli. It does no I/O. Errors, wrapped with the
// detail: [ErrInvalidName] for a bad name, [ErrInvalidOption] for a nil cli or a bad
// option (one of a lease or a hold among them: a gate has none).
func NewGate(cli *clientv3.Client, name string, opts ...Option) (*Gate, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("gate %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("a gate", core.ForLatch, opts)
	if err != nil {
		return nil, fmt.Errorf("gate %q: %w", name, err)
	}
	q := core.NewQueue(cli, cfg, name)
	return &Gate{s: core.NewShell("gate", name, q, nil), q: q, key: q.Prefix() + core.GateKey}, nil
}

// unmadeGate is the Shell of a Gate that NewGate did not make.
var unmadeGate = core.Unmade("gate")

// do runs op's f once g can serve it.
func (g *Gate) do(op string, f func() error) error {
	s := unmadeGate
	if g != nil {
		s = g.s.Or(unmadeGate)
	}
	if err := s.Check(op); err != nil {
		return err
	}
	if err := f(); err != nil {
		return s.Errorf(op, err)
	}
	return nil
}

// Hold closes the gate; held already, it stays so.
//
// Errors: ctx's error when ctx ends first (it may be held then or not).
//
// Cost: one Txn.
func (g *Gate) Hold(ctx context.Context) error {
	return g.do("hold", func() error {
		if _, err := core.Record(ctx, g.q.Client(), core.Claim{Prefix: g.q.Prefix(), Use: core.UseGate}, g.key, core.OwnerValue("")); err != nil {
			return core.WaitErr(ctx, g.q.Client(), err)
		}
		return nil
	})
}

// Release opens the gate, whoever held it, and lets every waiter through; open already, it
// stays so.
//
// Errors: ctx's error when ctx ends first (it may be open then or not).
//
// Cost: one delete.
func (g *Gate) Release(ctx context.Context) error {
	return g.do("release", func() error {
		if _, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.DeleteResponse, error) {
			return g.q.Client().Delete(clientv3.WithRequireLeader(ctx), g.key)
		}); err != nil {
			return core.WaitErr(ctx, g.q.Client(), err)
		}
		return nil
	})
}

// Wait returns once the gate is open: at once if it is not held, whatever happened before.
//
// Errors: ctx's error when ctx ends first; [ErrLost], wrapped, when the client is closed
// under it or the cluster went back in time (see package etcdsync).
//
// Cost: one read; while held, a watch of its key until its delete, and a read again after
// a gap in the watch.
func (g *Gate) Wait(ctx context.Context) error {
	return g.do("wait", func() error {
		cli := g.q.Client()
		_, err := core.Follow(ctx, cli, g.key, nil, func() (int64, core.Verdict, error) {
			resp, err := core.ReadState(ctx, cli, clientv3.OpGet(g.key, clientv3.WithCountOnly()))
			switch {
			case err != nil:
				return 0, core.StillWaiting, err
			case resp.Responses[0].GetResponseRange().Count == 0:
				return resp.Header.Revision, core.WaitOver, nil
			}
			return resp.Header.Revision, core.StillWaiting, nil
		}, func(ev *clientv3.Event) (core.Verdict, error) {
			if ev.Type == clientv3.EventTypeDelete {
				return core.WaitOver, nil
			}
			return core.StillWaiting, nil
		})
		return err
	})
}
