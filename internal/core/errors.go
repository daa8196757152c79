package core

import "errors"

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
)

// Busy reports whether err says that a try found the name taken (ErrLocked, ErrNoPermits),
// so that another try may find it free: the one test of it for trylock, the command and the
// tests.
func Busy(err error) bool {
	return errors.Is(err, ErrLocked) || errors.Is(err, ErrNoPermits)
}
