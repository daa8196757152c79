// Package primtest is the table of etcdsync's primitives that tests share: every way to
// hold a name (a Kind) behind one Locker interface, so that a property every primitive
// must have is written once and run over all of them, here and in securetest; and the
// small helpers every package's tests used to write out again (MustNew, Keys, AwaitKeys,
// CountedClient, NextLeader).
//
// Its own tests are those shared properties, each over every Kind it applies to: bad input
// is refused and writes nothing, a cancelled or timed-out wait leaves no key, a done ctx
// sends nothing, a failed try writes nothing, IsOwner fences only while held, tokens rise
// across holders, waiters are served in arrival order, nested names stay apart, an Unlock
// cut short is retried cleanly, and a revoked lease ends the hold and serves the next.
// What differs per primitive stays in the primitive's package.
package primtest
