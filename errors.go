package etcdsync

import "github.com/etcdsync/etcdsync/internal/core"

// ReleasedError is the error of a hold, or a wait, that an operator released
// (admin.Release, etcdsync release): errors.As finds it in what Err, Unlock or Lock return,
// with the key and the record the release left: its Reason, By (user@host) and At. It
// matches [ErrLost] and [ErrReleasedByOperator].
type ReleasedError = core.ReleasedError

// AskedError is the cause of a Do's fn's ctx when its hold was asked to let go and the
// primitive heeds asks ([WithYieldOnAsk]): the key asked and the record of the ask, with
// its Reason, By (user@host) and At. It matches [ErrAsked].
type AskedError = core.AskedError

// The errors of every etcdsync package, which re-export those they return.
var (
	// ErrInvalidName: New was given a name that is empty, over 512 bytes, not valid UTF-8,
	// or holds a NUL byte.
	ErrInvalidName = core.ErrInvalidName
	// ErrInvalidOption: an option or argument out of its documented range, or a nil client.
	// Every call on a handle that New did not make (a zero value, a nil pointer), and every
	// call through a closed client, returns it at once.
	ErrInvalidOption = core.ErrInvalidOption
	// ErrLocked: a try found the lock held, or a waiter ahead; it wrote nothing.
	ErrLocked = core.ErrLocked
	// ErrNoPermits: a try found too few of a semaphore's units free; it wrote nothing.
	ErrNoPermits = core.ErrNoPermits
	// ErrNotLocked: a release, or Err, without a hold, also once the hold was released.
	ErrNotLocked = core.ErrNotLocked
	// ErrLost: a hold, or a wait, ended without its release: its key was deleted, or its
	// lease expired, was revoked, or passed its local deadline (see Leases in the package doc).
	ErrLost = core.ErrLost
	// ErrReleasedByOperator: an operator released the hold by its token (admin.Release,
	// etcdsync release); the error says why, who and when. A loss: errors.Is(err, ErrLost)
	// holds too.
	ErrReleasedByOperator = core.ErrReleasedByOperator
	// ErrMaxHold: the hold passed the bound [WithMaxHold] set and ended by itself; its key
	// was then deleted. A loss: errors.Is(err, ErrLost) holds too.
	ErrMaxHold = core.ErrMaxHold
	// ErrAsked: the hold was asked to let go (admin.Ask, etcdsync ask); see Asking a holder
	// to let go in the package doc. It is no loss: the hold lasts until released.
	ErrAsked = core.ErrAsked
	// ErrStaleTicket: a ticket of a detached hold (mutex.Mutex.Detach) that no longer names
	// it: its key was released or went with its lease, the ticket was used to resume it
	// already, or the name was taken again. Nothing was written.
	ErrStaleTicket = core.ErrStaleTicket
	// ErrOtherKind: the name holds keys or records of another kind of primitive (a
	// semaphore's limit record under a name now locked, say), which this one would wait
	// behind, perhaps for good; nothing was written. The error names the key found. Once
	// nobody uses the name, admin.Delete (etcdsync delete) removes its lasting records.
	ErrOtherKind = core.ErrOtherKind
	// ErrLimitMismatch: a semaphore's limit in etcd changed under an acquisition: it was
	// lowered below the units a waiter asks (whose key is then deleted), or kept changing.
	ErrLimitMismatch = core.ErrLimitMismatch
	// ErrTimeout: trylock.Timeout ran out of time with the lock still busy.
	ErrTimeout = core.ErrTimeout
	// ErrNotLeader: an election call that needs leadership was made without it.
	ErrNotLeader = core.ErrNotLeader
	// ErrNoLeader: nobody leads the election.
	ErrNoLeader = core.ErrNoLeader
	// ErrNoCandidate: an election's transfer found no candidate with the value it named,
	// or the candidate it chose did not take the leadership over.
	ErrNoCandidate = core.ErrNoCandidate
	// ErrMixedClusters: the client's endpoints are members of different etcd clusters, so
	// a lock taken on one would exclude nobody on the other; no retry helps. The error
	// names each cluster's ID in hex.
	ErrMixedClusters = core.ErrMixedClusters
	// ErrNotEntered: a barrier's Leave without an Enter that returned nil, or after the
	// Leave that ended it.
	ErrNotEntered = core.ErrNotEntered
	// ErrAlreadySet: a latch's Set found its count set already; it wrote nothing.
	ErrAlreadySet = core.ErrAlreadySet
	// ErrNotSet: a latch without a count (never set, or deleted) was counted down or read;
	// or it was deleted while awaited.
	ErrNotSet = core.ErrNotSet
)
