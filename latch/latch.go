package latch

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// MaxCount is the highest count [Latch.Set] takes.
const MaxCount = core.MaxLatchCount

// Latch is a countdown latch on one name (see the package doc). It is safe for use by
// several goroutines.
//
// Only [New] makes a usable Latch: every method of the zero Latch and of a nil *Latch
// returns [ErrInvalidOption] at once, as does every call through a closed client.
type Latch struct {
	name string
	l    *core.Latch
}

// New returns the Latch on name over cli. It does no I/O. Errors, wrapped with the detail:
// [ErrInvalidName] for a bad name, [ErrInvalidOption] for a nil cli or a bad option (one
// of a lease or a hold among them).
func New(cli *clientv3.Client, name string, opts ...Option) (*Latch, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("latch: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("latch %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("a latch", core.ForLatch, opts)
	if err != nil {
		return nil, fmt.Errorf("latch %q: %w", name, err)
	}
	return &Latch{name: name, l: core.NewLatch(cli, cfg, name)}, nil
}

// usable is nil when l can serve a call, else why not.
func (l *Latch) usable(op string) error {
	if l == nil {
		return fmt.Errorf("latch: %s: %w", op, (*core.Latch)(nil).Unusable())
	}
	if err := l.l.Unusable(); err != nil {
		return l.errorf(op, err)
	}
	return nil
}

func (l *Latch) errorf(op string, err error) error {
	return fmt.Errorf("latch %q: %s: %w", l.name, op, err)
}

// Set sets the count, from 1 to [MaxCount], once per name: waiters are released when as
// many count downs as count have been made.
//
// Errors: [ErrAlreadySet] if the count was set already (by any Set, also one with the same
// count), having written nothing; [ErrInvalidOption] for count out of range, having sent
// nothing; ctx's error, when ctx ends first (the count may have been set then or not).
//
// Cost: one Txn.
func (l *Latch) Set(ctx context.Context, count int) error {
	if err := l.usable("set"); err != nil {
		return err
	}
	if count < 1 || count > MaxCount {
		return l.errorf("set", fmt.Errorf("%w: count %d is not within 1 to %d", ErrInvalidOption, count, MaxCount))
	}
	if err := set(ctx, l.l, count); err != nil {
		return l.errorf("set", err)
	}
	return nil
}

// CountDown lowers the count by one; at zero it does nothing. It counts once whatever its
// retries (a try that got no answer is tried again with the same marker), but two calls
// count twice: a participant that may call again for the same work, after a timeout or a
// restart, names itself with [Latch.CountDownAs].
//
// Errors: [ErrNotSet] if the latch has no count (a CountDown before the Set), having
// written nothing; ctx's error when ctx ends first (it may have counted then or not).
//
// Cost: one Txn.
func (l *Latch) CountDown(ctx context.Context) error {
	return l.CountDownAs(ctx, "")
}

// CountDownAs is [Latch.CountDown] by participant, which counts once for the life of the
// count: from the second call on by the same participant, it does nothing and returns nil.
// participant is a name (see [ErrInvalidName]); "" is CountDown.
func (l *Latch) CountDownAs(ctx context.Context, participant string) error {
	if err := l.usable("count down"); err != nil {
		return err
	}
	if participant != "" {
		if err := core.ValidateName(participant); err != nil {
			return l.errorf("count down", fmt.Errorf("participant: %w", err))
		}
	}
	if err := countDown(ctx, l.l, l.l.MarkerOf(participant)); err != nil {
		return l.errorf("count down", err)
	}
	return nil
}

// Await returns once the count is zero; at once if it is. Before the Set, it waits for the
// Set and then for zero.
//
// Errors: ctx's error when ctx ends first; [ErrNotSet], wrapped, when the latch is deleted
// while its count is above zero; [ErrLost], wrapped, when the client is closed under it,
// or the cluster went back in time (see package etcdsync).
//
// Cost: one read, and a watch of the latch's keys, which hears each count down; a read
// again after a gap in the watch.
func (l *Latch) Await(ctx context.Context) error {
	if err := l.usable("await"); err != nil {
		return err
	}
	if err := await(ctx, l.l); err != nil {
		return l.errorf("await", err)
	}
	return nil
}

// Count is the count now: what it was set to less the count downs, at least zero.
//
// Errors: [ErrNotSet] if the latch has no count; ctx's error.
//
// Cost: one read.
func (l *Latch) Count(ctx context.Context) (int, error) {
	if err := l.usable("count"); err != nil {
		return 0, err
	}
	n, err := count(ctx, l.l)
	if err != nil {
		return 0, l.errorf("count", err)
	}
	return n, nil
}

// Delete deletes the latch's keys, its count and its count downs, so that the name may be
// set again. A waiter whose count was above zero then fails with [ErrNotSet]; delete once
// the waiters have returned.
//
// Errors: ctx's error (the keys may have been deleted then or not).
//
// Cost: one Txn.
func (l *Latch) Delete(ctx context.Context) error {
	if err := l.usable("delete"); err != nil {
		return err
	}
	if err := deleteAll(ctx, l.l); err != nil {
		return l.errorf("delete", err)
	}
	return nil
}
