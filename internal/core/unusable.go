package core

import (
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
