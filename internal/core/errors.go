package core

import (
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The sentinel errors of every etcdsync package. Public packages re-export these values, so
// errors.Is(err, mutex.ErrLocked) and errors.Is(err, rwmutex.ErrLocked) are the same test.
var (
	// ErrInvalidName: a name that is empty, longer than MaxNameLen, not UTF-8 or holds a NUL byte.
	ErrInvalidName = errors.New("etcdsync: invalid name")
	// ErrInvalidOption: an option or argument out of its documented range.
	ErrInvalidOption = errors.New("etcdsync: invalid option")
	// ErrLocked: a try found a holder or a waiter ahead.
	ErrLocked = errors.New("etcdsync: locked")
	// ErrNoPermits: a try found every permit of a semaphore held.
	ErrNoPermits = errors.New("etcdsync: no permits available")
	// ErrNotLocked: a release without a hold.
	ErrNotLocked = errors.New("etcdsync: not locked")
	// ErrLost: the hold (or the wait) ended without a release: its key was deleted or its
	// session's lease expired or was revoked.
	ErrLost = errors.New("etcdsync: lost")
	// ErrLimitMismatch: a semaphore handle's limit differs from the one recorded in etcd.
	ErrLimitMismatch = errors.New("etcdsync: limit mismatch")
	// ErrTimeout: a timed try ran out of time.
	ErrTimeout = errors.New("etcdsync: timeout")
	// ErrNotLeader: an election call that needs leadership made without it.
	ErrNotLeader = errors.New("etcdsync: not leader")
	// ErrNoLeader: an election has no leader now.
	ErrNoLeader = errors.New("etcdsync: no leader")
	// ErrNotEntered: a barrier's Leave without an Enter that returned nil.
	ErrNotEntered = errors.New("etcdsync: not entered")
)

// Busy reports whether err says that a try found the name taken (ErrLocked, ErrNoPermits),
// so that another try may find it free: the one test of it for trylock, the command and the
// tests.
func Busy(err error) bool {
	return errors.Is(err, ErrLocked) || errors.Is(err, ErrNoPermits)
}

// What a public handle answers when it cannot serve a call at all: it was not made by New
// (a zero value or a nil pointer: no queue), or its client is closed, where etcd's client
// would retry a request until the caller's ctx ends instead of failing it.
var (
	errUnmade             = fmt.Errorf("%w: a handle not made by New (a zero value or a nil pointer)", ErrInvalidOption)
	errClientClosedOption = fmt.Errorf("%w: the etcd client is closed", ErrInvalidOption)
)

// Unusable says why q cannot serve a call: ErrInvalidOption for no queue (nil: the handle
// was not made by New) or a closed client; nil when it can. No I/O.
func (q *Queue) Unusable() error {
	switch {
	case q == nil:
		return errUnmade
	case q.cli.Ctx().Err() != nil:
		return errClientClosedOption
	}
	return nil
}

// unmadeKey is the key that UnmadeOwner compares: no name's key, since every name's keys
// end in "/" + a kind or a lease.
const unmadeKey = "etcdsync: no handle"

// UnmadeOwner is the IsOwner of a handle not made by New: a compare that never succeeds.
// Having no name, it compares a key outside every name; under a prefix grant etcd refuses
// it, which fails the Txn just the same.
func UnmadeOwner() clientv3.Cmp { return NeverOwner(unmadeKey) }

// EndIfClientClosed ends the hold as lost if its client is closed: nothing can release it
// through that client now, and its key goes with its lease, which nobody renews. It returns
// the loss, after which Release returns it at once; nil while the client is open.
func (h *Hold) EndIfClientClosed() error {
	if h == nil || h.cli.Ctx().Err() == nil {
		return nil
	}
	loss := fmt.Errorf("%w: %w", ErrLost, errClientClosed)
	h.observe(loss)
	return loss
}

// Unheld is err, why a handle is unusable, for a call that needs a hold (a release): it
// matches ErrNotLocked too, that call's answer without a hold.
func Unheld(err error) error { return fmt.Errorf("%w (%w)", err, ErrNotLocked) }

// NoReleases is the WatchRelease of a handle not made by New: arm's channel never yields.
func NoReleases() (arm func() <-chan struct{}, stop func()) {
	return func() <-chan struct{} { return nil }, func() {}
}
