// Package semaphore is a counting semaphore on etcd: at most limit permits of a name are
// held at any instant, across every client, granted first come, first served in the order
// of the keys' create revisions.
//
// Each permit is one key "<name>/permit/<lease hex>_<n>", bound to a lease that every
// primitive on the same client and TTL shares, so a worker that dies frees its permits when
// its lease expires. A waiter is served once fewer than limit keys are ahead of it; it
// learns that from the delete events of one watch per client and name, shared by all the
// client's waiters, so a release costs one watch event per client, not per waiter, and
// the waiter it serves sends no further RPC before Acquire returns.
//
// The limit is part of the name's state: the first user records it in the key
// "<name>/limit", which has no lease and stays after every permit is released. Every
// acquisition compares it in the Txn that writes its key, so a handle built with another
// limit gets ErrLimitMismatch and writes nothing. To change the limit, delete that key
// while no permit is held (etcdctl del '<name>/limit'); the next acquisition records its
// own. Names with '/' or '%' are escaped in keys, as in package mutex.
//
// A permit is not a fence. A process that pauses may wake after its lease expired and
// another worker took its permit. Guard the writes a permit protects with IsOwner in the
// same Txn, or with Token where the storage can compare tokens.
//
// See Example for a worker pool, and examples/workers for a program.
package semaphore
