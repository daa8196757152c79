// Package reentrant is a distributed lock on etcd that its owner may take again, as a
// recursive job does, with ownership carried in a [context.Context].
//
// [Mutex.Lock] returns a context that owns the hold. A Lock with that context, or any
// context derived from it, re-enters at once with no RPC and counts up; each [Mutex.Unlock]
// counts down, and the last one releases the lock. A context that owns nothing is a new
// owner and waits in FIFO order like any waiter, also on the same handle: goroutines that
// should share a hold share the owning context (they may re-enter and unlock concurrently),
// and goroutines that should exclude one another each start from their own. Ownership is per
// handle: a context that owns a hold through one Mutex is a stranger to another Mutex on the
// same name, and would wait for itself.
//
// The owning context is cancelled when the hold ends: with the loss as its cause, which
// matches [ErrLost], as soon as etcd says it was lost ([context.Cause] tells), with
// [context.Canceled] by the last Unlock. Run
// the work under the lock with it, so that it stops when the lock is gone. A Lock with an
// owning context whose hold was lost fails with ErrLost and does not queue again: a nested
// step never silently runs under a new hold that the outer steps know nothing of.
//
// Each owner writes one key "<name>/<lease hex>_<n>", bound to the lease that the
// primitives on the client share (see package etcdsync, which also holds the options and
// errors), with a value that names it for operators (`etcdctl get --prefix <name>/`):
// "host=<hostname> pid=<pid> owner=<random UUID>". The layout is package
// mutex's, so a reentrant.Mutex and a mutex.Mutex on the same name exclude one another; for a
// name without '/' and '%' so do etcd's concurrency.Mutex and `etcdctl lock`.
//
// A lock is not a fence: a process that pauses (GC, swap, a stopped VM) may wake after its
// lease expired and another holder came in, with nothing to tell it in time. Guard every
// write the lock protects with [Mutex.IsOwner] in the same Txn, or with [Mutex.Token] where
// the storage can compare tokens, so that the write of a holder that lost the lock fails.
//
// See Example, and examples/recursive for a program.
package reentrant
