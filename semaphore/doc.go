// Package semaphore is a counting semaphore on etcd: at most limit units of a name are
// held at any instant, across every client, granted first come, first served in the order
// of the keys' create revisions. [Semaphore.Acquire] takes one unit, [Semaphore.AcquireN]
// several at once, all or none.
//
// Each permit is one key, whatever its units: "<name>/permit/<lease hex>_<n>" for one unit,
// "<name>/permit/u<units>/<lease hex>_<n>" for more, bound to the lease that the primitives
// on the client share (see package etcdsync, which also holds the options and errors), so a
// worker that dies frees its permits when its lease expires. A waiter is served once its
// units fit beside those of every key ahead of it, held or waiting, so a waiter for many
// units is never overtaken by smaller ones behind it. It learns that from the delete events
// of one watch per client and name, shared by all the client's waiters, so a release costs
// one watch event per client, not per waiter, and the waiter it serves sends no further RPC
// before Acquire returns. Every client of a name must know permits of several units (see
// CHANGELOG.md): one that does not counts such a key as one unit.
//
// The limit is part of the name's state, in etcd: the first user records it in the key
// "<name>/limit" (with a marker beside it, "<name>/limit/<n>"), which has no lease and stays
// after every permit is released. From then on etcd's record is the limit, for every handle
// whatever limit it was made with: New's limit is the one recorded for a name that has none.
// Every acquisition compares the record in the Txn that writes its key; a handle that finds
// another limit there follows it (asking more units than it is [ErrInvalidOption]).
// [Semaphore.SetLimit] changes it while permits are held and waited for, and every waiter,
// of every handle, learns of the change in order with the releases: a raise serves those
// that now fit at once; after a lowering, the permits held keep holding and nobody new is
// served until the units in use fit. Names with '/' or '%' are escaped in keys, as in
// package mutex.
//
// A permit is not a fence. A process that pauses may wake after its lease expired and
// another worker took its permit. Guard the writes a permit protects with
// [Permit.IsOwner] in the same Txn, or with [Permit.Token] where the storage can compare
// tokens.
//
// See Example for a worker pool, and examples/workers for a program.
package semaphore
