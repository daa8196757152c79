package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Election is one candidate's handle on the election of a name, safe for use by several
// goroutines; it campaigns for one leadership at a time, and a Run's term holds it until
// lead has returned ([Election.Run]).
//
// Only [New] makes a usable Election. The zero Election and a nil *Election lead nothing and
// campaign for nothing, and none of their methods blocks or panics: Campaign and Leader
// return [ErrInvalidOption], Proclaim and Resign an error matching ErrInvalidOption and
// [ErrNotLeader], Observe a closed channel, and the others report no leadership (Token 0,
// Done closed, Err ErrNotLeader, IsOwner never true, Key "").
type Election struct {
	s         core.Shell
	turn      core.Turn     // taken from Campaign until the leadership ends, by Resign or loss
	resigning core.Turn     // one Resign at a time: taken while one runs
	pref      int           // WithPreference's
	settle    time.Duration // WithSettle's

	mu      sync.Mutex
	hold    *core.Hold
	changed chan struct{} // closed, and replaced, whenever hold changes
	term    *term         // the leadership a Run's lead runs on, until lead has returned
	kept    *core.Hold    // a Run's leadership whose transfer failed once lead returned: it leads on
	asker   *asker        // what asks the leadership to move, once followed (ask.go)
}

// A term is the leadership that a Run's lead runs on. If it ends while lead runs (lost, or
// resigned by another call), the turn stays taken until lead has returned: no other Run or
// Campaign of the handle leads while a lead of it may still act.
type term struct {
	h        *core.Hold
	ended    bool                    // the leadership has ended: endTerm gives the turn back
	stop     context.CancelCauseFunc // ends lead's ctx
	transfer *transferRequest        // a Transfer waiting for lead to return; nil for none
}

// A transferRequest is a Transfer of a Run's term, which the Run carries out once lead has
// returned (endTerm): to the candidate to matches, which answered proposal, or, with
// stepDown, a Resign.
type transferRequest struct {
	to       match
	proposal *proposal
	stepDown bool
	done     chan error // the outcome, once
}

// errTransferring is the cause of lead's ctx when a Transfer ends it.
var errTransferring = fmt.Errorf("%w: the leadership is being transferred", ErrNotLocked)

// errNoLeadership is what Resign, Proclaim and Err return without leadership: ErrNotLeader,
// which also matches ErrNotLocked, the shared convention of Err without a hold.
var errNoLeadership = fmt.Errorf("%w (%w)", ErrNotLeader, ErrNotLocked)

// New returns a handle on the election of name over cli. It does no I/O. Errors, wrapped
// with the detail: [ErrInvalidName] for a bad name, [ErrInvalidOption] for a bad option or a
// nil cli.
func New(cli *clientv3.Client, name string, opts ...Option) (*Election, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("election: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("election %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("an election", core.ForElection, opts)
	if err != nil {
		return nil, fmt.Errorf("election %q: %w", name, err)
	}
	q, tel := core.NewQueue(cli, cfg, name), core.NewTelemetry(cfg, core.PrimitiveElection, name)
	return &Election{
		s:       core.NewShell("election", name, q, tel),
		changed: make(chan struct{}),
		pref:    cfg.Preference,
		settle:  cfg.Settle,
	}, nil
}

// unmade is the Shell of an Election that New did not make.
var unmade = core.Unmade("election")

// shell is the Election's Shell, or unmade.
func (e *Election) shell() *core.Shell {
	if e == nil {
		return unmade
	}
	return e.s.Or(unmade)
}

// Campaign enters value as a candidate and returns once this handle leads, in FIFO order
// with every other candidate of the name. Before it returns, the leadership is checked alive
// (its key there, its session live) and watched, so that Done closes at once if it is lost
// later. While this handle leads or campaigns, another Campaign waits until the leadership
// ends: by Resign, or by loss, which a lost leader learns of when etcd says so (Done closes)
// and never resigns; the waiting Campaign then forgets the lost leadership, as Resign would,
// and campaigns. So does a Campaign that finds the leadership lost already. A leadership
// that a Run's lead runs on is the Run's until lead has returned, lost or not.
//
// Errors: [ErrLost] for a leadership lost while being won. ctx's error, wrapped, when ctx
// ends, having left no key (see [etcdsync] for how long that may take). [ErrInvalidOption]:
// e was not made by [New], or its client is closed.
//
// Cost: one Txn uncontended, and one lease grant on the client's first use.
func (e *Election) Campaign(ctx context.Context, value string) error {
	_, err := e.campaign(ctx, value, nil)
	return err
}

// campaign is Campaign, returning the leadership it won; for a Run's term if stop, which
// ends its lead's ctx, is not nil.
func (e *Election) campaign(ctx context.Context, value string, stop context.CancelCauseFunc) (_ *core.Hold, err error) {
	ctx, a, err := e.shell().Begin(ctx, core.Wait, "campaign", "etcdsync.election.Campaign")
	if err != nil {
		return nil, err
	}
	defer func() { a.End(err) }()
	if err := e.takeTurn(ctx); err != nil {
		return nil, e.errorf("campaign", err)
	}
	spec := core.CandidateSpec(value)
	spec.Tel = e.s.Tel
	if e.pref > 0 {
		spec.Kind = core.PreferenceKind(e.pref)
	}
	h, err := e.s.Q.Acquire(ctx, spec, nil)
	if err == nil {
		h.Done() // start the watch now: a loss from here on closes Done at once
		if !h.Live() {
			h.Abandon(ctx) // ends the hold; the key is gone, or goes now or with its lease
			err = fmt.Errorf("%w: the leadership ended as it was won", ErrLost)
		}
	}
	if err != nil {
		e.turn.Give()
		return nil, e.errorf("campaign", err)
	}
	a.Held(h)
	e.mu.Lock()
	if stop != nil {
		e.term = &term{h: h, stop: stop}
	}
	e.setHoldLocked(h)
	e.mu.Unlock()
	return h, nil
}

// takeTurn takes the handle's turn to campaign: at once if it is free, else once the
// leadership or the Campaign that has it ends. A leadership found lost is forgotten here,
// which gives the turn back (nobody else would), unless it is a Run's term: that Run gives
// it back once its lead has returned.
func (e *Election) takeTurn(ctx context.Context) error {
	var forgotten *core.Hold
	for {
		e.mu.Lock()
		h, changed := e.hold, e.changed
		e.mu.Unlock()
		var lost <-chan struct{}
		if h != nil && h != forgotten {
			lost = h.Done() // closed by a loss, or by a Resign under way, which frees the turn
		}
		taken, err := e.turn.TakeOr(ctx, changed, lost)
		switch {
		case taken:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-lost:
			forgotten = h
			_, _ = e.end(ctx, h) // no I/O: the hold has ended
		default: // the leadership changed: wait on the new one
		}
	}
}

// setHoldLocked makes h the handle's leadership (nil: none), and tells the Campaigns
// waiting. Under e.mu.
func (e *Election) setHoldLocked(h *core.Hold) {
	e.hold = h
	close(e.changed)
	e.changed = make(chan struct{})
}

// end releases h, a leadership of the handle, and gives the turn back if that ended it,
// unless h is a Run's term whose lead still runs (endTerm gives it back then).
func (e *Election) end(ctx context.Context, h *core.Hold) (ended bool, err error) {
	ended, err = h.Release(ctx)
	if ended {
		e.forget(h)
	}
	return ended, err
}

// forget drops h, a leadership of the handle that has ended, and gives the turn back,
// unless h is a Run's term whose lead still runs (endTerm gives it back then).
func (e *Election) forget(h *core.Hold) {
	e.mu.Lock()
	if e.hold == h {
		e.setHoldLocked(nil)
	}
	t := e.term
	kept := t != nil && t.h == h
	if kept {
		t.ended = true
	}
	e.mu.Unlock()
	if !kept {
		e.turn.Give()
	}
}

// endTerm ends a Run's term on h once its lead has returned: it gives the turn back if h has
// ended already, and otherwise hands h over if a Transfer asked, or resigns h. A handover
// that fails leaving h the handle's does neither: h is kept, and Run's next term leads on
// with it. Only h: a later leadership of the handle is another's to end. ErrNotLeader if h
// had ended.
func (e *Election) endTerm(ctx context.Context, h *core.Hold) error {
	e.mu.Lock()
	t := e.term
	ended := false
	var transfer *transferRequest
	if t != nil && t.h == h {
		e.term, ended, transfer = nil, t.ended, t.transfer
	}
	e.mu.Unlock()
	if ended {
		e.turn.Give()
	}
	switch {
	case transfer != nil && !ended && transfer.stepDown:
		err := e.resign(ctx, h)
		transfer.done <- err
		return err
	case transfer != nil && !ended:
		err := e.handOver(ctx, h, transfer.proposal)
		transfer.done <- err
		if err == nil || e.keep(h) {
			return nil
		}
	case transfer != nil:
		transfer.proposal.withdraw(ctx)
		transfer.done <- e.errorf("transfer", fmt.Errorf("%w: the leadership was lost", ErrLost))
	}
	return e.resign(ctx, h)
}

// keep keeps h, a Run's leadership whose handover failed, for the Run's next term, if it is
// still the handle's and live (see endTerm).
func (e *Election) keep(h *core.Hold) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.hold != h || !h.Live() {
		return false
	}
	e.kept = h
	return true
}

// takeKept reports whether endTerm kept h, the leadership of a Run's term that has ended,
// for the Run's next term (see keep), and forgets that it did.
func (e *Election) takeKept(h *core.Hold) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := h != nil && e.kept == h
	if kept {
		e.kept = nil
	}
	return kept
}

// resume makes h, a leadership a Run kept (takeKept), the leadership of its next term,
// whose lead's ctx stop ends; false if h has ended since, or is no longer the handle's
// (then the Run campaigns).
func (e *Election) resume(h *core.Hold, stop context.CancelCauseFunc) bool {
	if h == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.hold != h || e.term != nil || !h.Live() {
		return false
	}
	e.term = &term{h: h, stop: stop}
	return true
}

// Proclaim replaces the leader's value without a new election, writing only while this
// handle's key is the one it created; it retries through leader changes of etcd until ctx
// ends.
//
// Errors: [ErrNotLeader], having written nothing, without leadership or once it was lost
// (also through a closed client). ctx's error with ctx done already. On an Election not made
// by [New], an error matching [ErrInvalidOption] and ErrNotLeader.
//
// Cost: one Txn.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if s := e.shell(); s == unmade {
		return s.UnheldAs("proclaim", errNoLeadership)
	}
	h := e.current()
	_ = h.EndIfClientClosed()
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

// Resign ends the leadership with a delete fenced on the key's create revision, so that a
// late or repeated Resign never deposes a newer leader; the next candidate in line then
// leads. If etcd cannot be reached before ctx ends, or ctx is done already (then nothing is
// sent), the leadership stays and Resign may be called again. A Resign during another one
// waits for its outcome, then returns [ErrNotLeader] if that ended the leadership, and
// otherwise tries itself.
//
// Errors: [ErrNotLeader] without leadership. [ErrLost] if it was lost before, or the client is
// closed; the leadership has ended all the same. On an Election not made by [New], an error
// matching [ErrInvalidOption] and ErrNotLeader.
//
// Cost: one Txn.
func (e *Election) Resign(ctx context.Context) error {
	if s := e.shell(); s == unmade {
		return s.UnheldAs("resign", errNoLeadership)
	}
	return e.resign(ctx, e.current())
}

// resign ends h if it is still the handle's leadership; ErrNotLeader if it is not.
func (e *Election) resign(ctx context.Context, h *core.Hold) (err error) {
	ctx, a := e.shell().Start(ctx, core.Release, "etcdsync.election.Resign")
	defer func() { a.End(err) }()
	if h == nil {
		return e.errorf("resign", errNoLeadership)
	}
	if err := e.resigning.Take(ctx); err != nil {
		return e.errorf("resign", err)
	}
	defer e.resigning.Give()
	if e.current() != h {
		return e.errorf("resign", errNoLeadership) // ended before: by a Resign, or forgotten lost
	}
	_ = h.EndIfClientClosed()
	_, err = e.end(ctx, h)
	switch {
	case errors.Is(err, core.ErrNotLocked):
		return e.errorf("resign", errNoLeadership) // another call ended it
	case err != nil:
		return e.errorf("resign", err)
	}
	return nil
}

func (e *Election) current() *core.Hold {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hold
}

// Token is the leadership's fencing token: its key's create revision, strictly increasing
// across the successive leaders of the name, but a transfer, which hands the key and its
// token on (see the package doc); 0 without leadership. Like Done, Err, IsOwner and Key, it
// does no I/O.
func (e *Election) Token() int64 {
	return e.current().Token()
}

// Done is closed when the leadership ends, by Resign or by loss (then Err is [ErrLost]), as
// soon as etcd says the key or the lease is gone. Without leadership it is a closed channel.
func (e *Election) Done() <-chan struct{} {
	return e.current().Done()
}

// Err is nil while this handle leads, [ErrLost] once the leadership was lost (its key
// deleted, its lease expired or revoked) until Resign or the next Campaign, and
// [ErrNotLeader] (which also matches [ErrNotLocked]) without leadership.
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
	if e.shell() == unmade {
		return core.UnmadeOwner()
	}
	return e.s.Q.IsOwner(e.current())
}

func (e *Election) errorf(op string, err error) error { return e.shell().Errorf(op, err) }

// Key is the etcd key of this handle's leadership, the one IsOwner compares; "" without
// leadership.
func (e *Election) Key() string {
	if h := e.current(); h != nil {
		return h.Key()
	}
	return ""
}
