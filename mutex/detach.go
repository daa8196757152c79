package mutex

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Detach lets go of the hold without releasing it, for another process to resume: the
// key moves onto a lease of its own with the same TTL, which nobody renews, so the lock
// stays held for that TTL unless the ticket is resumed ([Resume]), renewed (`etcdsync
// renew`) or released (`etcdsync release --ticket`). m then holds nothing, as after
// Unlock; its Done closes with Err nil. The ticket is one shell-safe word, good for one
// Resume.
//
// Errors: [ErrNotLocked] without a hold. [ErrLost] if the hold was lost before (the hold
// has ended, as for Unlock). etcd's error otherwise: m still holds.
//
// Cost: a LeaseTimeToLive, a LeaseGrant and one Txn.
func (m *Mutex) Detach(ctx context.Context) (ticket string, err error) {
	if s := m.shell(); s == unmade {
		return "", s.Unheld("detach")
	}
	h := m.current()
	if h == nil {
		return "", m.errorf("detach", ErrNotLocked)
	}
	if err := m.unlocking.Take(ctx); err != nil {
		return "", m.errorf("detach", err)
	}
	defer m.unlocking.Give()
	if m.current() != h {
		return "", m.errorf("detach", ErrNotLocked)
	}
	t, err := h.Detach(ctx)
	if err != nil {
		return "", m.errorf("detach", err)
	}
	m.mu.Lock()
	m.hold = nil
	m.mu.Unlock()
	m.turn.Give()
	return t.String(), nil
}

// Resume makes a Mutex that holds the lock a [Mutex.Detach] let go of, with the same key
// and token, in this process or another: one Txn checks that the key is still the one the
// ticket names and takes it over, so a ticket resumes once; the Mutex then renews the
// key's lease itself (and revokes it once the hold ends) and watches it as Lock's holds
// are watched. opts are New's, and must put the keys where the detached Mutex's were
// (WithPrefix); the Mutex's later Locks use them as a New one would.
//
// Errors: [ErrInvalidOption] for a malformed ticket, or one whose key is not a Mutex's
// under the prefix; [etcdsync.ErrStaleTicket], saying why, when the hold is gone (released,
// its lease ran out), was resumed already, or the name was taken again: nothing is written
// then. etcd's error otherwise.
//
// Cost: a LeaseTimeToLive, one Txn and a LeaseKeepAliveOnce, then a watch of the key.
func Resume(ctx context.Context, cli *clientv3.Client, ticket string, opts ...Option) (*Mutex, error) {
	t, err := core.ParseTicket(ticket)
	if err != nil {
		return nil, fmt.Errorf("mutex: resume: %w", err)
	}
	cfg, err := core.OptionsFor("a mutex", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("mutex: resume: %w", err)
	}
	name, _, ok := cfg.NameOfKindKey(t.Key, "")
	if !ok {
		return nil, fmt.Errorf("mutex: resume: %w: the ticket's key %q is not a Mutex's under prefix %q", ErrInvalidOption, t.Key, cfg.Prefix)
	}
	m, err := New(cli, name, opts...)
	if err != nil {
		return nil, fmt.Errorf("mutex: resume: %w", err)
	}
	if err := m.turn.Take(ctx); err != nil {
		return nil, m.errorf("resume", err)
	}
	h, err := m.s.Q.Resume(ctx, t, core.Spec{})
	if err != nil {
		m.turn.Give()
		return nil, m.errorf("resume", err)
	}
	m.s.Tel.Held(h)
	m.mu.Lock()
	m.hold = h
	m.mu.Unlock()
	return m, nil
}
