// Package election is leader election on etcd: candidates campaign on a name, the one
// that campaigned first among those alive leads, and observers follow who leads and what
// the leader proclaims.
//
// A campaign writes one key "<name>/<lease hex>_<n>" holding the candidate's value, bound
// to a lease that every primitive on the same client and TTL shares, and waits for the keys
// created before it to go: the leader is the live key with the lowest create revision. For
// a name without '/' and '%' that is the prefix etcd's concurrency.Election and `etcdctl
// elect` use, and they take the leader the same way, so they and this package see the same
// leader on the same name and wait for one another; other names are escaped so that "a",
// "a/b" and "ab" never meet.
//
// Fixes over concurrency.Election: Campaign never reports a leadership whose lease lapsed
// or whose key went meanwhile; a cancelled or failed Campaign leaves no key; a Resign that
// fails keeps the leadership so that it can be retried (etcd-io/etcd#22123); a leader
// learns of its loss at once (Done, Err); Observe says when nobody leads, rides out
// compaction and member failover, and never repeats or reorders what it sends.
//
// Leadership is not a fence. A leader that pauses (GC, swap, a stopped VM) may wake after
// its lease expired and another candidate took over, with nothing to tell it in time. Guard
// every write the leader makes with IsOwner in the same Txn, or with Token where the storage
// can compare tokens, so that a deposed leader's writes fail.
//
// See examples/leader for a program.
package election
