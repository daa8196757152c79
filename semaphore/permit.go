package semaphore

import (
	"context"
	"fmt"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Permit is one permit of a [Semaphore], of one unit or several, from its acquisition until
// [Permit.Release]. Its methods are safe for use by several goroutines.
//
// Only Acquire, AcquireN, TryAcquire and TryAcquireN make a Permit that holds. A nil
// *Permit (the one a failed Acquire returns) and the zero Permit hold nothing: Release
// returns an error matching both [ErrInvalidOption] and [ErrNotLocked], and the others
// report no hold (Token 0, Done closed, Err ErrNotLocked, IsOwner never true, Key ""). None
// of them blocks or panics.
type Permit struct {
	s         *Semaphore
	h         *core.Hold
	units     int
	releasing core.Turn   // one Release at a time: taken while one runs
	ended     atomic.Bool // Release has ended it
}

func newPermit(s *Semaphore, h *core.Hold, units int) *Permit {
	return &Permit{s: s, h: h, units: units}
}

// Units is how many units the permit holds: 1 from Acquire and TryAcquire, n from AcquireN
// and TryAcquireN; 0 once released, and for a nil or zero Permit.
func (p *Permit) Units() int {
	if p.hold() == nil {
		return 0
	}
	return p.units
}

// made reports whether p was made by Acquire or TryAcquire.
func (p *Permit) made() bool { return p != nil && p.h != nil }

// Release gives the permit back, all its units at once, with a delete fenced on the key's
// create revision: a late or repeated Release never frees another permit. If etcd cannot be
// reached before ctx ends, or ctx is done already (then nothing is sent), the permit stays
// held and Release may be called again. A Release during another one waits for its
// outcome, then returns [ErrNotLocked] if that released the permit, and otherwise tries
// itself.
//
// Errors: [ErrNotLocked] once released. [ErrLost] if the permit was lost before, or the
// client is closed; the permit has ended all the same (the key goes with its lease). On a
// nil or zero Permit, an error matching [ErrInvalidOption] and ErrNotLocked.
//
// Cost: one Txn.
func (p *Permit) Release(ctx context.Context) (err error) {
	if !p.made() {
		return fmt.Errorf("semaphore: release: %w", core.Unheld(fmt.Errorf("%w: no permit (a nil or zero Permit)", ErrInvalidOption)))
	}
	ctx, a := p.s.sh.Start(ctx, core.Release, "etcdsync.semaphore.Release")
	defer func() { a.End(err) }()
	if p.ended.Load() {
		return p.s.errorf("release", ErrNotLocked)
	}
	if err := p.releasing.Take(ctx); err != nil {
		return p.s.errorf("release", err)
	}
	defer p.releasing.Give()
	if p.ended.Load() {
		return p.s.errorf("release", ErrNotLocked) // the Release before this one ended it
	}
	_ = p.h.EndIfClientClosed()
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
	if !p.made() || p.ended.Load() {
		return nil
	}
	return p.h
}

// Token is the permit's fencing token: its key's create revision, increasing in the order
// permits of the name are granted; 0 once released. Like Done, Err, IsOwner and Key, it
// does no I/O.
func (p *Permit) Token() int64 {
	return p.hold().Token()
}

// Done is closed when the permit ends: by Release, or by loss (then Err is [ErrLost]).
//
// Cost: the first call to Done or Err starts a watch of the permit's key and session (from
// the key's creation on, so a loss that came before is reported at once); a permit that is
// never asked costs no watch. Either way Release reports a loss, and IsOwner fences writes.
func (p *Permit) Done() <-chan struct{} {
	if !p.made() {
		return core.Closed
	}
	return p.h.Done()
}

// Err is nil while the permit is held, [ErrLost] once it was lost (its key deleted, its
// lease expired or revoked) until Release, and [ErrNotLocked] after Release.
func (p *Permit) Err() error {
	return p.hold().Err()
}

// Asked is closed once the permit is asked to let go (see Asking a holder to let go in
// package etcdsync); nil for a Permit not acquired.
func (p *Permit) Asked() <-chan struct{} {
	return p.hold().Asked()
}

// IsOwner is a Txn compare that succeeds only while this permit's key exists with its
// create revision: put it in the If of every write the permit guards. After Release it
// never succeeds, and compares a key among the name's permit keys, so that a role granted
// only those (and the limit record) may evaluate it.
func (p *Permit) IsOwner() clientv3.Cmp {
	if !p.made() {
		return core.UnmadeOwner()
	}
	if h := p.hold(); h != nil {
		return h.IsOwner()
	}
	return core.NeverOwner(p.s.sh.Q.Prefix() + permitKind)
}

// Key is the permit's key in etcd, "<name>/permit/<lease hex>_<n>" under the name's prefix
// for a permit of one unit, "<name>/permit/u<units>/<lease hex>_<n>" for one of more;
// "" once released, and for a nil or zero Permit.
func (p *Permit) Key() string {
	if h := p.hold(); h != nil {
		return h.Key()
	}
	return ""
}

// Detach lets go of the permit without releasing it, for another process to resume with
// [Resume]: its key moves onto a lease of its own with the same TTL, which nobody
// renews, so its units stay taken for that TTL unless the ticket is resumed, renewed
// (`etcdsync renew`) or released (`etcdsync release --ticket`). The permit then holds
// nothing, as after Release. See mutex.Mutex.Detach for the ticket.
//
// Errors: [ErrNotLocked] once released or detached. [ErrLost] if the permit was lost
// before. etcd's error otherwise: the permit still holds.
//
// Cost: a LeaseTimeToLive, a LeaseGrant and one Txn.
func (p *Permit) Detach(ctx context.Context) (ticket string, err error) {
	if !p.made() {
		return "", fmt.Errorf("semaphore: detach: %w", core.Unheld(fmt.Errorf("%w: no permit (a nil or zero Permit)", ErrInvalidOption)))
	}
	if err := p.releasing.Take(ctx); err != nil {
		return "", p.s.errorf("detach", err)
	}
	defer p.releasing.Give()
	if p.ended.Load() {
		return "", p.s.errorf("detach", ErrNotLocked)
	}
	t, err := p.h.Detach(ctx)
	if err != nil {
		return "", p.s.errorf("detach", err)
	}
	p.ended.Store(true)
	return t.String(), nil
}
