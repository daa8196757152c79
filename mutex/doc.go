// Package mutex is a distributed mutual-exclusion lock on etcd, granted first come, first
// served in the order of the keys' create revisions.
//
// Each [Mutex.Lock] writes one key "<name>/<lease hex>_<n>", bound to the lease that the
// primitives on the client share (see package etcdsync, which also holds the options and
// errors). For a name without '/' and '%' that is the layout of etcd's concurrency.Mutex and
// of `etcdctl lock`, so all three exclude one another on the same name; other names are
// escaped, so that "a", "a/b" and "ab" never meet.
//
// A lock is not a fence: a process that pauses (GC, swap, a stopped VM) may wake after its
// lease expired and another holder came in, with nothing to tell it in time. Guard every
// write the lock protects with [Mutex.IsOwner] in the same Txn, or with [Mutex.Token] where
// the storage can compare tokens, so that the write of a holder that lost the lock fails.
//
// A [Multi] holds several names at once, all or none: its keys, one per name, are written
// in one Txn and share one create revision, so that two Multis meet in the same order on
// every name they share and cannot deadlock; they are ordinary keys of each name.
//
// See Example for a fenced write, ExampleMulti for several names, and examples/counter and
// examples/transfer for programs.
package mutex
