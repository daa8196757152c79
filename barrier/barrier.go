package barrier

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// MaxParticipants is the largest n [New] takes.
const MaxParticipants = core.MaxParticipants

// Barrier is a double barrier of n participants on one name: one participant at a time
// per Barrier; a process with several participants makes a Barrier for each. Its methods
// may be called from several goroutines; an Enter or Leave under way makes another wait.
//
// Only [New] makes a usable Barrier: every method of the zero Barrier and of a nil
// *Barrier returns [ErrInvalidOption] at once, as does every call through a closed client.
type Barrier struct {
	s    core.Shell
	b    *double
	turn core.Turn

	mu sync.Mutex
	p  *participant // entered, not yet left
}

// New returns a Barrier of n participants, from 1 to [MaxParticipants], on name over cli.
// It does no I/O. Errors, wrapped with the detail: [ErrInvalidName] for a bad name,
// [ErrInvalidOption] for n out of range, a nil cli or a bad option (one of a hold among
// them).
func New(cli *clientv3.Client, name string, n int, opts ...Option) (*Barrier, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("barrier: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("barrier %q: %w: nil client", name, ErrInvalidOption)
	}
	if n < 1 || n > MaxParticipants {
		return nil, fmt.Errorf("barrier %q: %w: %d participants is not within 1 to %d", name, ErrInvalidOption, n, MaxParticipants)
	}
	cfg, err := core.OptionsFor("a barrier", core.ForBarrier, opts)
	if err != nil {
		return nil, fmt.Errorf("barrier %q: %w", name, err)
	}
	b := newDouble(cli, cfg, name, n)
	return &Barrier{s: core.NewShell("barrier", name, b.q, nil), b: b}, nil
}

// unmade is the Shell of a Barrier that New did not make.
var unmade = core.Unmade("barrier")

// shell is the Barrier's Shell, or unmade.
func (b *Barrier) shell() *core.Shell {
	if b == nil {
		return unmade
	}
	return b.s.Or(unmade)
}

func (b *Barrier) errorf(op string, err error) error { return b.shell().Errorf(op, err) }

// begin takes b's turn for op, once b can serve it.
func (b *Barrier) begin(ctx context.Context, op string) error {
	if err := b.shell().Check(op); err != nil {
		return err
	}
	if err := b.turn.Take(ctx); err != nil {
		return b.errorf(op, err)
	}
	return nil
}

// Enter writes this participant's key and returns once n participants have entered, this
// one among them: the first n by create revision since the last round filled (see the
// package doc).
//
// Errors: [ErrInvalidOption] if this Barrier has entered and not left, or another n is
// recorded for the name; ctx's error when ctx ends first, and [ErrLost] when the key went
// (its lease expired or was revoked); each having deleted the key.
//
// Cost: one Txn, a watch of the round record and one read; then one event per round filled
// or participant withdrawn, and a read after an event that did not fill its round. The
// participant whose put makes n sends one more Txn, which fills the round.
func (b *Barrier) Enter(ctx context.Context) error {
	if err := b.begin(ctx, "enter"); err != nil {
		return err
	}
	defer b.turn.Give()
	if b.entered() != nil {
		return b.errorf("enter", fmt.Errorf("%w: entered already; Leave first", ErrInvalidOption))
	}
	p, err := b.b.enter(ctx)
	if err != nil {
		return b.errorf("enter", err)
	}
	b.mu.Lock()
	b.p = p
	b.mu.Unlock()
	return nil
}

// Leave deletes this participant's key, and returns once every participant of its round
// has left, or gone with its lease.
//
// Errors: [ErrNotEntered] without an Enter that returned nil, or after the Leave that ended
// it (beside [ErrInvalidOption] for a Barrier not made by New, or a closed client);
// [ErrLost] when this participant's key went before it left (the others counted it as
// gone: see the package doc), or its client is closed (the key goes with its lease);
// ctx's error when ctx ends first, having deleted the key. The participant has left after
// any of them but ErrNotEntered.
//
// Cost: one fenced delete and a read, then a watch of one key, and a read of it, until it
// goes: for each participant but the first of the round, about once; the first hears each
// of the others.
func (b *Barrier) Leave(ctx context.Context) error {
	if s := b.shell(); s == unmade {
		return s.UnheldAs("leave", ErrNotEntered)
	}
	if err := b.turn.Take(ctx); err != nil {
		return b.errorf("leave", err)
	}
	defer b.turn.Give()
	b.mu.Lock()
	p := b.p
	b.p = nil
	b.mu.Unlock()
	unusable := b.b.q.Unusable() // a closed client
	switch {
	case p == nil && unusable != nil:
		return b.errorf("leave", fmt.Errorf("%w (%w)", unusable, ErrNotEntered))
	case p == nil:
		return b.errorf("leave", ErrNotEntered)
	case unusable != nil:
		// Nothing can delete the key through this client: it goes with its lease.
		return b.errorf("leave", p.h.EndIfClientClosed())
	}
	if err := b.b.leave(ctx, p); err != nil {
		return b.errorf("leave", err)
	}
	return nil
}

// entered is this participant since it entered; nil when it has not (or b is nil).
func (b *Barrier) entered() *participant {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.p
}

// Done is closed when this participant's key is gone: after its Leave, or its loss (its
// lease expired or was revoked, or an operator deleted it); a Barrier that has not entered
// returns a closed channel. It starts a watch of the key, as a hold's does.
func (b *Barrier) Done() <-chan struct{} {
	if p := b.entered(); p != nil {
		return p.h.Done()
	}
	return (*core.Hold)(nil).Done()
}

// Round is the number of this participant's round on the name since it entered: 1 for the
// first round the name filled, 2 for the next, and so on; 0 when it has not entered.
func (b *Barrier) Round() int64 {
	if p := b.entered(); p != nil {
		return p.round
	}
	return 0
}

// Token is this participant's place since it entered, its key's create revision; 0 when
// it has not entered. Not a fencing token: see the package doc.
func (b *Barrier) Token() int64 {
	if p := b.entered(); p != nil {
		return p.h.Token()
	}
	return 0
}
