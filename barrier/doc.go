// Package barrier is a double barrier on etcd: n participants, in any processes, enter
// together and leave together. [Barrier.Enter] returns once n participants have entered;
// [Barrier.Leave] once every participant that entered with it has left.
//
// Each participant is a key "<name>/in/<lease hex>_<n>" bound to the lease that the
// primitives on the client share (see package etcdsync, which also holds the options and
// errors), so a participant that crashes leaves by itself once its lease expires: before its
// round filled, it is not counted; after, it counts as one that entered and left. A name is
// used in rounds, one after another: a round is the first n participants by create
// revision after the round before it, so n+k participants arriving together make one round
// of n, and the k wait for the next one. Where each round ends is kept in a record
// "<name>/round", and n in "<name>/size"; neither has a lease, and they stay after the last
// participant left (the next participants go on from them). Every participant of a name must
// use the same n: an Enter with another is [ErrInvalidOption].
//
// An Enter that fails or is cancelled deletes its key before it returns. If its round filled
// first, the others count it as one that entered and left at once, as one that crashed.
// Leave deletes the participant's key, and the first participant of a round leaves last
// (as in ZooKeeper's recipe), so a round's Leave costs each participant about one watch
// event. Names with '/' or '%' are escaped in keys, as in package mutex.
//
// A barrier is not a lock, and gives no fencing token: a participant whose lease expires
// after Enter is counted as gone by the others while it may still be working. Leave then
// returns [ErrLost].
//
// See Example, examples/barrier for a program, and the command's `etcdsync barrier`.
package barrier
