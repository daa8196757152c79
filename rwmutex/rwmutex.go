package rwmutex

import (
	"fmt"
	"slices"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The two kinds of key under the name. They are etcd's recipe.RWMutex's, so that its
// readers and writers and ours take turns on a name without '/' and '%'.
const (
	readKind  = core.KindRead
	writeKind = core.KindWrite
)

// The specs of the two kinds of key (core.ReadSpec, ...), written now by this process.
func readSpec() core.Spec       { return core.ReadSpec(core.OwnerValue("")) }
func upgradableSpec() core.Spec { return core.UpgradableSpec(core.OwnerValue("")) }
func writeSpec() core.Spec      { return core.WriteSpec(core.OwnerValue("")) }

// RWMutex is a distributed readers/writer lock on one name, safe for use by several
// goroutines like [sync.RWMutex]. Many readers hold it at once, a writer alone, in FIFO
// order of arrival in etcd.
//
// The readers of one handle share one etcd key: the first one in writes it, the last one out
// deletes it; the others join with no RPC and leave after one read of the key (shared by the
// readers leaving at the same time) that proves it was there all along. A group stops taking
// members once a writer, of this handle or any other, queues behind its key (this handle's
// own at once, another's once its key reaches this client's watch of the name).
//
// [RWMutex.RUnlock] does not say which reader leaves: once a read hold of the handle is known
// lost while readers hold through it, every RUnlock returns [ErrLost], and RLock waits
// (TryRLock returns [ErrLocked]) until every reader of the handle has left. No reader of a
// lost hold is ever told its read was sound.
//
// As with sync.RWMutex, a goroutine must neither RLock nor Lock a handle whose read lock it
// holds: once a writer waits, either call waits forever; nor Upgrade, which waits for that
// reader to leave.
//
// Only [New] makes a usable RWMutex. The zero RWMutex and a nil *RWMutex hold nothing and
// take nothing, and none of their methods blocks or panics: RLock, TryRLock, Lock,
// TryLock, ULock and TryULock return [ErrInvalidOption], RUnlock, Unlock, UUnlock,
// Downgrade and Upgrade an error matching both ErrInvalidOption and [ErrNotLocked], and the
// others report no hold (Token 0, Done closed, Err ErrNotLocked, IsOwner never true, Key "").
type RWMutex struct {
	w, r      core.Shell // of the write side and of the read side: one queue, a telemetry each
	turn      core.Turn  // the writers' one-at-a-time: taken while a Lock waits or holds
	uturn     core.Turn  // the upgradable reads' one-at-a-time: taken while a ULock waits or holds
	unlocking core.Turn  // one Unlock, UUnlock, Downgrade or Upgrade at a time: taken while one runs

	mu       sync.Mutex
	write    *core.Hold    // the write hold
	up       *core.Hold    // the upgradable read's hold
	upgraded bool          // up is a write hold now (Upgrade)
	wpending *pendingWrite // while this handle's Lock queues
	groups   []*group      // read groups, oldest first: held or queued
	readLoss *readLoss     // while readers of a lost read hold may still be in the handle
}

// New returns an RWMutex on name over cli. It does no I/O. Errors, wrapped with the
// detail: [ErrInvalidName] for a bad name, [ErrInvalidOption] for a bad option or a nil cli.
func New(cli *clientv3.Client, name string, opts ...Option) (*RWMutex, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("rwmutex: %w", err)
	}
	if cli == nil {
		return nil, fmt.Errorf("rwmutex %q: %w: nil client", name, ErrInvalidOption)
	}
	cfg, err := core.OptionsFor("an rwmutex", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("rwmutex %q: %w", name, err)
	}
	q := core.NewQueue(cli, cfg, name).WatchArrivals()
	return &RWMutex{
		w: core.NewShell("rwmutex", name, q, core.NewTelemetry(cfg, core.PrimitiveWrite, name)),
		r: core.NewShell("rwmutex", name, q, core.NewTelemetry(cfg, core.PrimitiveRead, name)),
	}, nil
}

// unmade is the Shell of an RWMutex that New did not make.
var unmade = core.Unmade("rwmutex")

// wshell is the Shell of the write side, or unmade; rshell the read side's.
func (rw *RWMutex) wshell() *core.Shell {
	if rw == nil {
		return unmade
	}
	return rw.w.Or(unmade)
}

func (rw *RWMutex) rshell() *core.Shell {
	if rw == nil {
		return unmade
	}
	return rw.r.Or(unmade)
}

// current is the write hold, else the upgradable read, else the newest read hold, else nil.
func (rw *RWMutex) current() *core.Hold {
	if rw == nil {
		return nil
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if w := rw.exclusive(); w != nil {
		return w
	}
	if rw.up != nil {
		return rw.up
	}
	for _, g := range slices.Backward(rw.groups) {
		if g.hold != nil && g.members > 0 {
			return g.hold
		}
	}
	return nil
}

// Token is the write hold's fencing token: its key's create revision, strictly increasing
// across the successive writers of the name; 0 without a write hold. Like Done, Err, IsOwner
// and Key, it does no I/O.
func (rw *RWMutex) Token() int64 {
	if rw == nil {
		return 0
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.exclusive().Token()
}

// exclusive is the handle's write hold: Lock's, else an upgraded read's; nil for none.
// Under rw.mu.
func (rw *RWMutex) exclusive() *core.Hold {
	switch {
	case rw.write != nil:
		return rw.write
	case rw.upgraded:
		return rw.up
	}
	return nil
}

// Done is closed when the current hold ends: the write hold if this handle has one (Lock's,
// or an upgraded read's), else its upgradable read, else its newest read hold (shared by
// the readers of a group). Without a hold it is a closed
// channel. Cost: the first call on a hold starts a watch of its key.
func (rw *RWMutex) Done() <-chan struct{} {
	return rw.current().Done()
}

// Err is nil while the current hold (see [RWMutex.Done]) lasts, [ErrLost] once it was lost,
// and [ErrNotLocked] without a hold.
func (rw *RWMutex) Err() error {
	return rw.current().Err()
}

// Asked is closed once the current hold (see [RWMutex.Done]) is asked to let go (see Asking
// a holder to let go in package etcdsync); nil without a hold. The readers of one handle
// share a key, and so are asked together.
func (rw *RWMutex) Asked() <-chan struct{} {
	return rw.current().Asked()
}

// IsOwner is a Txn compare that succeeds only while this handle's write hold lasts: put it
// in the If of every write the lock guards. A read hold has none (it does not exclude other
// readers). Without a write hold it never succeeds, and compares a key among the name's
// write keys, so that a role granted only the read and write keys may evaluate it.
func (rw *RWMutex) IsOwner() clientv3.Cmp {
	if rw.wshell() == unmade {
		return core.UnmadeOwner()
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	w := rw.exclusive()
	if w == nil {
		return core.NeverOwner(rw.w.Q.Prefix() + writeKind)
	}
	return w.IsOwner()
}

func (rw *RWMutex) errorf(op string, err error) error { return rw.wshell().Errorf(op, err) }

// Key is the etcd key of this handle's current hold, the one Done follows (see
// [RWMutex.Done]); "" without a hold.
func (rw *RWMutex) Key() string {
	if h := rw.current(); h != nil {
		return h.Key()
	}
	return ""
}

// WatchRelease lets a caller that retries a failed TryLock wake when the lock may have come
// free instead of sleeping blindly; trylock's Retry and Timeout use it. Call arm before each
// TryLock: its channel yields once a key of the name, read or write, is deleted after that,
// or when the watch cannot tell whether one was, so a wake may be spurious. Call stop once
// done, from any goroutine; arm is for one goroutine at a time. On an RWMutex not made by
// [New], arm's channel never yields.
//
// Cost: none of its own. It shares the client's one watch of the name with every waiter
// there (the first registration on a client opens it); neither it nor arm ever blocks.
func (rw *RWMutex) WatchRelease() (arm func() <-chan struct{}, stop func()) {
	if rw.wshell() == unmade {
		return core.NoReleases()
	}
	return rw.w.Q.WatchRelease("")
}

// WatchWriteRelease is [RWMutex.WatchRelease] for a caller that retries a failed TryRLock:
// only the delete of a write key wakes it, since a read lock waits for writers alone.
func (rw *RWMutex) WatchWriteRelease() (arm func() <-chan struct{}, stop func()) {
	if rw.wshell() == unmade {
		return core.NoReleases()
	}
	return rw.w.Q.WatchRelease(writeKind)
}
