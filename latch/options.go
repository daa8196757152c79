package latch

import (
	"github.com/etcdsync/etcdsync"
)

// What every etcdsync package shares is defined and documented in package etcdsync; these
// are its names, so that code using this package needs no second import. A latch has no
// lease: WithTTL and WithSession, like the options of holds (WithMaxHold, WithLockDelay),
// are [ErrInvalidOption] here.

// Option is [etcdsync.Option].
type Option = etcdsync.Option

// WithPrefix is [etcdsync.WithPrefix].
func WithPrefix(prefix string) Option { return etcdsync.WithPrefix(prefix) }

// The errors this package returns, those of package etcdsync; compare with errors.Is.
var (
	ErrInvalidName   = etcdsync.ErrInvalidName
	ErrInvalidOption = etcdsync.ErrInvalidOption
	ErrAlreadySet    = etcdsync.ErrAlreadySet
	ErrNotSet        = etcdsync.ErrNotSet
	ErrLost          = etcdsync.ErrLost
)
