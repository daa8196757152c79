package semaphore

import (
	"context"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Permit is one permit of a Semaphore, from Acquire until Release. Its methods are safe
// for use by several goroutines; those of a nil Permit report no hold.
type Permit struct {
	s     *Semaphore
	h     *core.Hold
	ended atomic.Bool // Release has ended it
}

// Release gives the permit back: one Txn that deletes its key only while the key's create
// revision is still this permit's, so a late or repeated Release never frees another
// permit. A second Release returns ErrNotLocked; one after the permit was lost returns
// ErrLost (the permit has ended all the same). If etcd cannot be reached before ctx ends,
// the permit stays held and Release may be called again.
func (p *Permit) Release(ctx context.Context) error {
	if p == nil {
		return ErrNotLocked
	}
	ended, err := p.h.Release(ctx)
	if ended {
		p.ended.Store(true)
	}
	if err != nil {
		return p.s.errorf("release", err)
	}
	return nil
}

func (p *Permit) hold() *core.Hold {
	if p == nil || p.ended.Load() {
		return nil
	}
	return p.h
}

// Token is the permit's fencing token: its key's create revision, increasing in the order
// permits of the name are granted. 0 once released.
func (p *Permit) Token() int64 {
	return p.hold().Token()
}

// Done is closed when the permit ends: by Release, or by loss (then Err is ErrLost).
//
// The first call to Done or Err starts a watch of the permit's key and session (from the
// key's creation on, so a loss that came before is reported at once); a permit that is
// never asked costs no watch. Either way Release reports a loss, and IsOwner fences writes.
func (p *Permit) Done() <-chan struct{} {
	if p == nil {
		return core.Closed
	}
	return p.h.Done()
}

// Err is nil while the permit is held, ErrLost once it was lost (its key deleted, its
// lease expired or revoked) until Release, and ErrNotLocked after Release.
func (p *Permit) Err() error {
	return p.hold().Err()
}

// IsOwner is a Txn compare that succeeds only while this permit's key exists with its
// create revision: put it in the If of every write the permit guards. After Release it
// never succeeds.
func (p *Permit) IsOwner() clientv3.Cmp {
	if p == nil {
		return core.NeverOwner(permitKind)
	}
	return p.s.q.IsOwner(p.hold())
}
