// Package primtest is the table of etcdsync's primitives that tests share: every way to
// hold a name (a Kind) behind one Locker interface, so that a property every primitive
// must have is written once and run over all of them, here and in securetest; and the
// small helpers every package's tests used to write out again (MustNew, Keys, AwaitKeys,
// CountedClient, NextLeader).
//
// Its own tests are those shared properties, each over every Kind it applies to: bad input is
// refused and writes nothing, a cancelled or timed-out wait leaves no key, a done ctx sends
// nothing, a failed try writes nothing, IsOwner fences only while held, tokens rise across
// holders, waiters are served in arrival order, nested names stay apart, an Unlock cut short
// is retried cleanly, a revoked lease ends the hold and serves the next, clients on members
// that apply behind the leader never hold beside one another nor lose a hold for nothing, and
// Do holds while fn runs (another's Lock on another member waits), releases after it (also
// when fn panics or ctx ends) and ends fn's ctx on a loss with ErrLost as its cause. Tests in
// which a client waits for what a client of another member did run on three members
// (LaggingCluster; the shared cluster under -short). What differs per primitive stays in the
// primitive's package.
package primtest
