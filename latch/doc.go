// Package latch is a countdown latch on etcd: a count set once per name, counted down by
// any process, and awaited until it reaches zero by any number of waiters, each of which is
// woken.
//
// The count is data, not a hold: it has no lease, and stays in etcd, whoever set or counted
// it and whatever became of them, until [Latch.Delete]. Its keys are the record
// "<name>/latch", whose value is the count it was set to and the ID of that Set, and a
// marker "<name>/latch/<participant>" per count down; the count is the record's less the
// markers, never below zero. A participant that names itself ([Latch.CountDownAs]) writes
// its marker once, so it counts once however often it tries, after a timeout or from
// another process; [Latch.CountDown] counts once per call, retries included. Count downs
// contend with nobody: each writes a key of its own.
//
// [Latch.Await] reads the count, then watches the latch's keys and counts the markers
// created; after any gap in the watch (history compacted, a reconnect, an auth change) it
// reads again. A wait that begins at zero returns after its read. Names with '/' or '%'
// are escaped in keys, as in package mutex, and so are participants' names.
//
// See Example, and the command's `etcdsync latch` for shell scripts.
package latch
