package election

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Election is one candidate's handle on the election of a name. It is safe for use by
// several goroutines; it campaigns for one leadership at a time.
type Election struct {
	name string
	q    *core.Queue
	turn chan struct{} // full from Campaign until the leadership ends by Resign

	mu   sync.Mutex
	hold *core.Hold
}

// errNoLeadership is what Resign, Proclaim and Err return without leadership: ErrNotLeader,
// which also matches ErrNotLocked, the shared convention of Err without a hold.
var errNoLeadership = fmt.Errorf("%w (%w)", ErrNotLeader, ErrNotLocked)

// New returns a handle on the election of name over cli. It does no I/O. A bad name returns
// ErrInvalidName, a bad option or a nil client ErrInvalidOption, both wrapped with detail.
func New(cli *clientv3.Client, name string, opts ...Option) (*Election, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("election: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("election %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.Options(opts)
	if err != nil {
		return nil, fmt.Errorf("election %q: %w", name, err)
	}
	return &Election{
		name: name,
		q:    core.NewQueue(cli, core.SessionsFor(cli, cfg), cfg.KeyPrefix(name)),
		turn: make(chan struct{}, 1),
	}, nil
}

// Campaign enters value as a candidate and returns once this handle leads, in FIFO order
// with every other candidate of the name. Uncontended it costs one Txn (and one lease grant
// on the client's first use). Before it returns it makes sure the leadership is still
// alive (its key there, its session live) and starts watching it, so Done closes at once if
// it is lost later; a leadership lost while being won returns ErrLost. If ctx ends first it
// returns ctx's error, wrapped, after deleting its key: a failed Campaign leaves no key.
//
// While this handle leads, another Campaign waits for Resign. A leadership that was lost
// (Done closed) is forgotten by the next Campaign, as Resign would.
func (e *Election) Campaign(ctx context.Context, value string) error {
	if h := e.current(); h != nil {
		select {
		case <-h.Done():
			_ = e.Resign(ctx) // lost: returns ErrLost and frees the handle
		default:
		}
	}
	select {
	case e.turn <- struct{}{}:
	case <-ctx.Done():
		return e.errorf("campaign", ctx.Err())
	}
	h, err := e.q.Acquire(ctx, core.Spec{Slots: 1, Value: value}, nil)
	if err == nil {
		h.Done() // start the watch now: a loss from here on closes Done at once
		if !h.Live() {
			h.Abandon(ctx) // ends the hold; the key is gone, or goes now or with its lease
			err = fmt.Errorf("%w: the leadership ended as it was won", ErrLost)
		}
	}
	if err != nil {
		<-e.turn
		return e.errorf("campaign", err)
	}
	e.mu.Lock()
	e.hold = h
	e.mu.Unlock()
	return nil
}

// Proclaim replaces the leader's value without a new election: one Txn that writes only
// while this handle's key is the one it created. Without leadership, or once it was lost,
// it returns ErrNotLeader and writes nothing.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	h := e.current()
	if h == nil || !h.Live() {
		return e.errorf("proclaim", errNoLeadership)
	}
	written, err := h.Put(ctx, value)
	switch {
	case err != nil:
		return e.errorf("proclaim", err)
	case !written:
		return e.errorf("proclaim", fmt.Errorf("%w: the leadership was lost", ErrNotLeader))
	}
	return nil
}

// Resign ends the leadership: one Txn that deletes the key only while its create revision
// is still this leadership's, so a late or repeated Resign never deposes a newer leader.
// The next candidate in line then leads. It returns ErrNotLeader without leadership, and
// ErrLost (the leadership has ended all the same) if it was lost before. If etcd cannot be
// reached before ctx ends, the leadership stays and Resign may be called again.
func (e *Election) Resign(ctx context.Context) error {
	h := e.current()
	if h == nil {
		return e.errorf("resign", errNoLeadership)
	}
	ended, err := h.Release(ctx)
	if ended {
		e.mu.Lock()
		if e.hold == h {
			e.hold = nil
		}
		e.mu.Unlock()
		<-e.turn
	}
	switch {
	case errors.Is(err, core.ErrNotLocked):
		return e.errorf("resign", errNoLeadership) // another call ended it
	case err != nil:
		return e.errorf("resign", err)
	}
	return nil
}

func (e *Election) current() *core.Hold {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hold
}

// Token is the fencing token of the leadership: its key's create revision, strictly
// increasing across the successive leaders of the name. 0 without leadership.
func (e *Election) Token() int64 {
	return e.current().Token()
}

// Done is closed when the leadership ends: by Resign, or by loss (then Err is ErrLost), as
// soon as etcd says the key or the lease is gone. Without leadership it is an already
// closed channel.
func (e *Election) Done() <-chan struct{} {
	return e.current().Done()
}

// Err is nil while this handle leads, ErrLost once the leadership was lost (its key deleted,
// its lease expired or revoked) until Resign or the next Campaign, and ErrNotLeader (which
// also matches ErrNotLocked) without leadership.
func (e *Election) Err() error {
	if h := e.current(); h != nil {
		return h.Err()
	}
	return errNoLeadership
}

// IsOwner is a Txn compare that succeeds only while this leadership's key exists with its
// create revision: put it in the If of every write the leader makes. Without leadership it
// never succeeds.
func (e *Election) IsOwner() clientv3.Cmp {
	return e.q.IsOwner(e.current())
}

func (e *Election) errorf(op string, err error) error {
	return fmt.Errorf("election %q: %s: %w", e.name, op, err)
}
