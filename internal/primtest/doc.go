// Package primtest is the table of etcdsync's primitives that tests share: every way to
// hold a name (a Kind) behind one Locker interface, so that a property every primitive must
// have is written once and run over all of them, here and in securetest; and the small
// helpers every package's tests used to write out again (the keys of a name, a counted
// client).
//
// Its own tests are those shared properties: bad input is refused and writes nothing, a
// cancelled or timed-out wait leaves no key, a done context sends nothing, a failed try
// writes nothing. What differs per primitive stays in the primitive's package.
package primtest
