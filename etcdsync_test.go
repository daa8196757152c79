package etcdsync_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
	"github.com/etcdsync/etcdsync/trylock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEveryPackageReturnsTheRootsErrors: each package's error is the root's value itself,
// so that errors.Is with any package's name matches the error of any other.
func TestEveryPackageReturnsTheRootsErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want error
	}{
		{"mutex.ErrInvalidName", mutex.ErrInvalidName, etcdsync.ErrInvalidName},
		{"mutex.ErrInvalidOption", mutex.ErrInvalidOption, etcdsync.ErrInvalidOption},
		{"mutex.ErrLocked", mutex.ErrLocked, etcdsync.ErrLocked},
		{"mutex.ErrNotLocked", mutex.ErrNotLocked, etcdsync.ErrNotLocked},
		{"mutex.ErrLost", mutex.ErrLost, etcdsync.ErrLost},
		{"rwmutex.ErrInvalidName", rwmutex.ErrInvalidName, etcdsync.ErrInvalidName},
		{"rwmutex.ErrInvalidOption", rwmutex.ErrInvalidOption, etcdsync.ErrInvalidOption},
		{"rwmutex.ErrLocked", rwmutex.ErrLocked, etcdsync.ErrLocked},
		{"rwmutex.ErrNotLocked", rwmutex.ErrNotLocked, etcdsync.ErrNotLocked},
		{"rwmutex.ErrLost", rwmutex.ErrLost, etcdsync.ErrLost},
		{"reentrant.ErrInvalidName", reentrant.ErrInvalidName, etcdsync.ErrInvalidName},
		{"reentrant.ErrInvalidOption", reentrant.ErrInvalidOption, etcdsync.ErrInvalidOption},
		{"reentrant.ErrLocked", reentrant.ErrLocked, etcdsync.ErrLocked},
		{"reentrant.ErrNotLocked", reentrant.ErrNotLocked, etcdsync.ErrNotLocked},
		{"reentrant.ErrLost", reentrant.ErrLost, etcdsync.ErrLost},
		{"semaphore.ErrInvalidName", semaphore.ErrInvalidName, etcdsync.ErrInvalidName},
		{"semaphore.ErrInvalidOption", semaphore.ErrInvalidOption, etcdsync.ErrInvalidOption},
		{"semaphore.ErrNoPermits", semaphore.ErrNoPermits, etcdsync.ErrNoPermits},
		{"semaphore.ErrLimitMismatch", semaphore.ErrLimitMismatch, etcdsync.ErrLimitMismatch},
		{"semaphore.ErrNotLocked", semaphore.ErrNotLocked, etcdsync.ErrNotLocked},
		{"semaphore.ErrLost", semaphore.ErrLost, etcdsync.ErrLost},
		{"election.ErrInvalidName", election.ErrInvalidName, etcdsync.ErrInvalidName},
		{"election.ErrInvalidOption", election.ErrInvalidOption, etcdsync.ErrInvalidOption},
		{"election.ErrNotLeader", election.ErrNotLeader, etcdsync.ErrNotLeader},
		{"election.ErrNotLocked", election.ErrNotLocked, etcdsync.ErrNotLocked},
		{"election.ErrNoLeader", election.ErrNoLeader, etcdsync.ErrNoLeader},
		{"election.ErrLost", election.ErrLost, etcdsync.ErrLost},
		{"trylock.ErrTimeout", trylock.ErrTimeout, etcdsync.ErrTimeout},
		{"trylock.ErrLocked", trylock.ErrLocked, etcdsync.ErrLocked},
		{"trylock.ErrNoPermits", trylock.ErrNoPermits, etcdsync.ErrNoPermits},
		{"trylock.ErrInvalidOption", trylock.ErrInvalidOption, etcdsync.ErrInvalidOption},
	} {
		assert.True(t, tc.got == tc.want, "%s is not the root's value", tc.name)
	}
}
