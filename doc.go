// Package etcdsync holds what every etcdsync primitive shares: the options that configure
// them, the errors they return, and [Shutdown], which a program calls as it exits (see the
// Example). The primitives, and the tools around them, are packages of their own:
//
//   - mutex: one holder at a time, first come first served; Multi: several names at once.
//   - rwmutex: many readers or one writer, fair to writers.
//   - reentrant: a lock that its owner, a context, may take again.
//   - semaphore: at most n units held at once, taken one or several at a time.
//   - trylock: try without queueing, with retry and timeout, on any of the locks.
//   - election: one leader among candidates, and a leader loop (Run).
//   - barrier: a double barrier (n participants enter and leave together), and a gate.
//   - latch: a countdown latch; every waiter wakes once it reaches zero.
//   - once: a job run at most once per period across every process (cron on every host).
//   - fence: a hold's token checked in the caller's SQL transaction.
//   - admin: who holds and who waits for a name, for operators' tools; a release by token.
//   - cmd/etcdsync: the command, for shell scripts and cron jobs (lock, elect, once, status, ...).
//
// Each primitive's package re-exports the names here that it uses (mutex.WithTTL is
// [WithTTL], mutex.ErrLost is [ErrLost]), so that code that uses one package needs no
// second import. An [Option] made in one package configures a primitive of any other.
//
// # Leases
//
// Every key a primitive writes is bound to a lease. Without [WithSession], the primitives of
// every package on one *clientv3.Client with one TTL share one lease and one keep-alive,
// granted by the first acquisition: when the lease ends, every hold on it is lost at once
// (Done closes, Err returns [ErrLost]), and the next acquisition grants a new one. The keys
// of a holder that dies go when its lease expires, a TTL ([DefaultTTL] unless [WithTTL])
// after its last renewal, or at once with [Shutdown].
//
// The shared lease is renewed a third of the TTL after the last renewal was sent, and it
// has a local deadline: the time the last renewal that etcd answered was sent, plus the
// TTL, less a margin of 1% of the TTL plus 100 ms. etcd lets a lease expire no earlier than
// a TTL after it received a renewal, so when the deadline passes with no renewal through,
// the holds on the lease end with ErrLost before etcd can serve anyone else in their place.
// This assumes that this process's clock and the etcd leader's run at rates within 1% of
// each other, and that this process acts on its timer within 100 ms: a process that is
// paused (GC, a stopped VM) cannot act on any deadline, so fence the writes a hold guards
// with its IsOwner or Token. If etcd answers again after the deadline, the lease is revoked
// at once, so that the keys of holds told they lost hold nobody up. A session given with
// WithSession has no local deadline: its end is known when its own keep-alive or a hold's
// watch notices it.
//
// # Waiting
//
// A blocking acquisition writes its key in one Txn, which also counts what is ahead of it:
// its create revision is its place in line. A waiter then hears each release through its
// client's one watch of the name, shared by every waiter and release watch of that client
// there, and is served on the event that takes the last key ahead away, with no further RPC.
// A release reaches the clients of the waiters near the head, not every waiting client: a
// waiter far back, on a client with no watch of the name yet, first reads the keys just
// ahead of its own (one read-only Txn), passes over the two nearest and watches the next on
// the client's watch stream: one key for an exclusive waiter, the fewest that together
// weigh capacity minus weight plus one units for a semaphore's (up to 8 keys; a larger
// semaphore's waiter joins the name's watch at once). While those keys weigh that much it
// cannot be served; once enough of them are gone, two hand-offs or so before its turn, it
// joins the name's watch (with one read of the name). A client's watch of a name closes
// once it has had no waiter for 2 s or through eight releases of other clients (one, after
// a waiter that came from far back); the release of its own last waiter's key does not
// count, so a client that locks again at once still finds it.
//
// # Cancellation
//
// Every call that may block takes a [context.Context] first and returns promptly once it
// ends, with ctx's error wrapped; with a ctx done already, a call sends nothing. A call that
// writes a key (Lock, TryLock, RLock, Acquire, Campaign and their kin) and whose ctx ends
// while its Txn is in flight awaits etcd's answer up to 1 s more, which says whether and at
// which create revision its key was written, then deletes that key, fenced on its create
// revision, for up to 1 s: it returns within about 2 s of ctx's end whatever etcd does,
// and leaves no key behind (a delete that etcd has not answered by then is finished in the
// background).
//
// A release (Unlock, RUnlock, Release, Resign) honours its ctx: a delete in flight when ctx
// ends is awaited up to 1 s more; if etcd cannot be reached before then, or ctx is done
// already, the hold stays and the release may be called again, so release with a ctx that
// outlives the work the hold guards (reentrant's last Unlock is the exception: see
// reentrant.Mutex.Unlock). The release that a Do makes once fn has returned runs on a
// context of its own, of 5 s, also when Do's ctx has ended; one that does not get through
// by then is retried in the background until etcd answers.
//
// # Asking a holder to let go
//
// Every hold can be asked to let go, by its token: admin.Ask (etcdsync ask) leaves a record
// beside the hold's key, fenced by the token (a name taken again since is never asked), and
// the hold's Asked channel (mutex.Mutex.Asked, and each primitive's) closes. Nothing else
// happens by itself: the holder finishes its step and releases, or goes on. A Do heeds it
// only with [WithYieldOnAsk], which ends fn's ctx with an [AskedError] as its cause. An
// election's leader takes an ask as a request to step down (election.Election.Asked, Yield;
// Run heeds it by itself). The first call to Asked on
// a hold reads the record and then follows it, a watch on the client's stream, until the
// hold ends; a hold never asked for its channel costs nothing. The record lies on a lease
// of its own for ten minutes, so a hold whose Asked is first called later than that after
// the ask is not told of it; the release of a hold that was told deletes it (one Txn more).
//
// # Errors
//
// The sentinel errors here are the same values in every package (mutex.ErrLocked ==
// rwmutex.ErrLocked). Calls wrap them with the name and the operation, and sometimes with a
// second sentinel (an Unlock on a handle that New did not make matches both
// [ErrInvalidOption] and [ErrNotLocked]): compare with [errors.Is].
package etcdsync
