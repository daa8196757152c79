package mutex

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// MaxNames is the most names a [Multi] takes: its Txn has two ops per name in a branch,
// and etcd refuses more than 128 by default (--max-txn-ops).
const MaxNames = core.MaxNames

// Multi is a distributed lock on several names at once, all or none, safe for use by
// several goroutines as a [Mutex] is. Its Lock writes one key per name in one Txn, so that
// they share one create revision: any two Multis meet in the same order on every name they
// share, and none can wait for another in a cycle, whatever order their callers list the
// names in. Its keys are ordinary mutex keys: a [Mutex], etcd's concurrency.Mutex and
// `etcdctl lock` on any one of the names queue with it.
//
// The zero Multi and a nil *Multi behave as the zero [Mutex] does.
type Multi struct {
	s         core.Shell // its Q is the first name's
	names     []string
	qs        []*core.Queue
	turn      core.Turn
	unlocking core.Turn

	mu      sync.Mutex
	group   *core.Group
	waiting []string // keys of the acquisition under way
}

// NewMulti returns a Multi on names over cli, sorted and without duplicates. It does no
// I/O. Errors, wrapped with the detail: [ErrInvalidName] for a bad name,
// [ErrInvalidOption] for no name, more than [MaxNames] distinct ones, a bad option or a
// nil cli. With [WithNameAttribute], the attribute is the names joined by ",".
func NewMulti(cli *clientv3.Client, names []string, opts ...Option) (*Multi, error) {
	sorted := slices.Compact(slices.Sorted(slices.Values(names)))
	for _, name := range sorted {
		if err := core.ValidateName(name); err != nil {
			return nil, fmt.Errorf("mutex multi: %w", err)
		}
	}
	label := "mutex multi " + quoteNames(sorted)
	if len(sorted) == 0 || len(sorted) > MaxNames {
		return nil, fmt.Errorf("%s: %w: %d names; one to %d", label, ErrInvalidOption, len(sorted), MaxNames)
	}
	if cli == nil {
		return nil, fmt.Errorf("%s: %w: nil client", label, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("a mutex", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	qs := core.NewQueues(cli, cfg, sorted)
	if err := core.FitOneTxn(qs, core.OwnerValue("")); err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	tel := core.NewTelemetry(cfg, core.PrimitiveMulti, strings.Join(sorted, ","))
	return &Multi{s: core.NewShell(label, "", qs[0], tel), names: sorted, qs: qs}, nil
}

// unmadeMulti is the Shell of a Multi that NewMulti did not make.
var unmadeMulti = core.Unmade("mutex multi")

// shell is the Multi's Shell, or unmadeMulti.
func (m *Multi) shell() *core.Shell {
	if m == nil {
		return unmadeMulti
	}
	return m.s.Or(unmadeMulti)
}

// queues are the Multi's queues; nil for a Multi that NewMulti did not make.
func (m *Multi) queues() []*core.Queue {
	if m.shell() == unmadeMulti {
		return nil
	}
	return m.qs
}

// Lock waits until m holds every one of its names. Each name is served in FIFO order with
// every other waiter on it; m holds when no name has a key ahead of its own. The handle
// stays taken until [Multi.Unlock], also once the hold is lost.
//
// Errors: as [Mutex.Lock]; a cancelled or failed Lock deletes all its keys in one Txn,
// fenced on their create revision.
//
// Cost: one Txn uncontended, whatever the number of names; a waiter shares the client's
// watch of each name it waits on.
func (m *Multi) Lock(ctx context.Context) error {
	_, err := m.lock(ctx)
	return err
}

// lock is Lock, returning the hold it took.
func (m *Multi) lock(ctx context.Context) (_ *core.Group, err error) {
	ctx, a, err := m.shell().Begin(ctx, core.Wait, "lock", "etcdsync.mutex.Multi.Lock")
	if err != nil {
		return nil, err
	}
	defer func() { a.End(err) }()
	if err := m.turn.Take(ctx); err != nil {
		return nil, m.errorf("lock", err)
	}
	g, err := core.AcquireAll(ctx, m.qs, m.spec(), m.setWaiting)
	a.HeldGroup(g)
	m.mu.Lock()
	m.waiting, m.group = nil, g
	m.mu.Unlock()
	if err != nil {
		m.turn.Give()
		return nil, m.errorf("lock", err)
	}
	return g, nil
}

// TryLock takes every name only if none has a holder or a waiter, and m neither holds nor
// waits.
//
// Errors: [ErrLocked] otherwise, having written nothing. ctx's error and
// [ErrInvalidOption] as for [Multi.Lock].
//
// Cost: one Txn.
func (m *Multi) TryLock(ctx context.Context) (err error) {
	ctx, a, err := m.shell().Begin(ctx, core.Try, "try lock", "etcdsync.mutex.Multi.TryLock")
	if err != nil {
		return err
	}
	defer func() { a.End(err) }()
	if !m.turn.TryTake() {
		return m.errorf("try lock", ErrLocked)
	}
	g, err := core.TryAcquireAll(ctx, m.qs, core.LockSpec(core.OwnerValue("")))
	a.HeldGroup(g)
	if err != nil {
		m.turn.Give()
		return m.errorf("try lock", err)
	}
	m.mu.Lock()
	m.group = g
	m.mu.Unlock()
	return nil
}

// Unlock releases every name in one Txn, each key deleted only if it is still this hold's:
// after a loss it removes the keys that are left. It behaves as [Mutex.Unlock] otherwise:
// [ErrLost] if any key was lost before (the hold has ended all the same), [ErrNotLocked]
// without a hold, and a hold that stays when etcd cannot be reached before ctx ends.
//
// Cost: one Txn.
func (m *Multi) Unlock(ctx context.Context) error {
	if s := m.shell(); s == unmadeMulti {
		return s.Unheld("unlock")
	}
	return m.release(ctx, m.current())
}

// release releases g if it is still the handle's hold, as [Mutex] does its own.
func (m *Multi) release(ctx context.Context, g *core.Group) (err error) {
	ctx, a := m.shell().Start(ctx, core.Release, "etcdsync.mutex.Multi.Unlock")
	defer func() { a.End(err) }()
	if g == nil {
		return m.errorf("unlock", ErrNotLocked)
	}
	if err := m.unlocking.Take(ctx); err != nil {
		return m.errorf("unlock", err)
	}
	defer m.unlocking.Give()
	if m.current() != g {
		return m.errorf("unlock", ErrNotLocked) // released before: by an Unlock, or fn in Do
	}
	_ = g.EndIfClientClosed()
	ended, err := g.Release(ctx)
	if ended {
		m.mu.Lock()
		m.group = nil
		m.mu.Unlock()
		m.turn.Give()
	}
	if err != nil {
		return m.errorf("unlock", err)
	}
	return nil
}

func (m *Multi) current() *core.Group {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.group
}

func (m *Multi) setWaiting(keys []string) {
	m.mu.Lock()
	m.waiting = keys
	m.mu.Unlock()
}

// Token is the hold's fencing token: the one create revision that all its keys share,
// strictly increasing across the successive holders of each of its names; 0 without a
// hold. Like Done, Err, IsOwner, Keys and Names, it does no I/O.
func (m *Multi) Token() int64 { return m.current().Token() }

// Done is closed when the current hold ends, by [Multi.Unlock] or by the loss of any of
// its keys (then Err is [ErrLost]); without a hold it is a closed channel. The first call
// to Done or Err on a hold starts the watch of its keys, as [Mutex.Done] does.
func (m *Multi) Done() <-chan struct{} { return m.current().Done() }

// Asked is closed once the hold of any of its names is asked to let go (see Asking a holder
// to let go in package etcdsync); nil without a hold.
func (m *Multi) Asked() <-chan struct{} { return m.current().Asked() }

// Err is nil while every name is held, [ErrLost] once any key was lost (until Unlock), and
// [ErrNotLocked] without a hold.
func (m *Multi) Err() error { return m.current().Err() }

// IsOwner is one Txn compare per name, in the order of [Multi.Names], each of which
// succeeds only while this hold's key of that name exists with its create revision: put
// all of them in the If of every write the lock guards. Without a hold they never succeed.
func (m *Multi) IsOwner() []clientv3.Cmp {
	g := m.current()
	if g != nil {
		return g.IsOwner()
	}
	cmps := make([]clientv3.Cmp, max(len(m.queues()), 1))
	for i := range cmps {
		if qs := m.queues(); len(qs) > 0 {
			cmps[i] = qs[i].IsOwner(nil)
		} else {
			cmps[i] = core.UnmadeOwner()
		}
	}
	return cmps
}

// Keys are this handle's keys in etcd while it holds or waits, in the order of
// [Multi.Names], else nil.
func (m *Multi) Keys() []string {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.group != nil {
		return m.group.Keys()
	}
	return slices.Clone(m.waiting)
}

// Names are the Multi's names, sorted and without duplicates.
func (m *Multi) Names() []string {
	if m == nil {
		return nil
	}
	return slices.Clone(m.names)
}

func (m *Multi) errorf(op string, err error) error { return m.shell().Errorf(op, err) }

// quoteNames is names in a message: all of them up to four, else the first three and how
// many more.
func quoteNames(names []string) string {
	if len(names) <= 4 {
		return fmt.Sprintf("%q", names)
	}
	return fmt.Sprintf("%q and %d more", names[:3], len(names)-3)
}

// WatchRelease is [Mutex.WatchRelease] for all of m's names at once: arm's channel yields
// once a key of any of them is deleted after arm was called (an Unlock, a waiter giving up,
// a lost lease), or when the watch of one cannot tell whether one was, so a wake may be
// spurious. trylock's Retry and Timeout over a Multi use it to try again when a name ahead
// comes free. Call stop once done, from any goroutine; arm is for one goroutine at a time.
// On a Multi not made by [NewMulti], arm's channel never yields.
//
// Cost: no RPC of its own: it shares the client's watch of each name with every waiter
// there.
func (m *Multi) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	qs := m.queues()
	if len(qs) == 0 {
		return core.NoReleases()
	}
	r := core.WatchReleasesAll(qs, "")
	return r.Arm, r.Stop
}

// Do takes every name as [Multi.Lock] does, runs fn while they are held, and releases them
// once fn has returned, as [Mutex.Do] does: fn's ctx ends as soon as any key is lost, with
// the loss as its cause, and Do releases only the hold it took.
//
// Errors and cost: as [Mutex.Do], with Multi's Lock and Unlock.
func (m *Multi) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return m.errorf("do", core.ErrNilFunc)
	}
	g, err := m.lock(ctx)
	if err != nil {
		return err
	}
	return core.Scoped(ctx, g, fn, func(ctx context.Context) error { return m.release(ctx, g) })
}

// spec is the spec of a blocking acquisition by this handle, counted in its telemetry.
func (m *Multi) spec() core.Spec {
	spec := core.LockSpec(core.OwnerValue(""))
	spec.Tel = m.s.Tel
	return spec
}
