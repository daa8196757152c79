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
type Gate struct {
	s core.Shell
	g *core.Gate
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
	g := core.NewGate(cli, cfg, name)
	return &Gate{s: core.NewShell("gate", name, g.Queue(), nil), g: g}, nil
}

// unmadeGate is the Shell of a Gate that NewGate did not make.
var unmadeGate = core.Unmade("gate")

// do runs op's f once g can serve it.
func (g *Gate) do(op string, f func(*core.Gate) error) error {
	s := unmadeGate
	if g != nil {
		s = g.s.Or(unmadeGate)
	}
	if err := s.Check(op); err != nil {
		return err
	}
	if err := f(g.g); err != nil {
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
	return g.do("hold", func(c *core.Gate) error { return c.Hold(ctx) })
}

// Release opens the gate, whoever held it, and lets every waiter through; open already, it
// stays so.
//
// Errors: ctx's error when ctx ends first (it may be open then or not).
//
// Cost: one delete.
func (g *Gate) Release(ctx context.Context) error {
	return g.do("release", func(c *core.Gate) error { return c.Release(ctx) })
}

// Wait returns once the gate is open: at once if it is not held, whatever happened before.
//
// Errors: ctx's error when ctx ends first; [ErrLost], wrapped, when the client is closed
// under it or the cluster went back in time (see package etcdsync).
//
// Cost: one read; while held, a watch of its key until its delete, and a read again after
// a gap in the watch.
func (g *Gate) Wait(ctx context.Context) error {
	return g.do("wait", func(c *core.Gate) error { return c.Wait(ctx) })
}
