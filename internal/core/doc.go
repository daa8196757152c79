// Package core is the one implementation behind every etcdsync primitive: names and
// keys, options, the shared session layer, and a wait-for-predecessor queue ordered by
// create revision whose holds report their own loss.
//
// Public packages adapt it to their vocabulary; no algorithm lives twice.
//
// # Where things live
//
// Names, keys and options:
//   - names.go: ValidateName, NamePrefix (a name's escaped key prefix).
//   - options.go: Option, Config (TTL, session, prefix); metrics.go and tracing.go: the
//     Telemetry of a handle (instruments, attribute sets, spans).
//   - slots.go: the key of an acquisition, "<prefix><kind><lease hex>_<slot>", reused from
//     one acquisition to the next; owner.go: the value written into it.
//   - errors.go: the sentinel errors every package re-exports, and Busy.
//
// A client's state (client.go): one clientState per *clientv3.Client, the only registry of
// core, dropped when the client closes. It holds:
//   - its shared sessions (session.go: one lease per TTL, Shutdown; keepalive.go: the
//     renewals and the local deadline, one timer per session);
//   - its hubs (hub.go: one watch per name and mode, shared by every waiter, sentry,
//     release watch and observer of the client on the name; registry.go: join, leave,
//     linger; dispatch.go: events in revision order, once; subscriber.go: what a hub feeds);
//   - its keyWatch (keywatch.go: one gRPC watch stream for the keys of every watched hold,
//     each create under a fresh ID; a watch cancelled or refused has its key read first);
//   - its janitor (janitor.go: cleanups that outlive the call that needed them);
//   - its clock (clock.go: the highest revision seen, and the rewind of everything when
//     the cluster went back in time; clusters.go: answers from more than one cluster,
//     ErrMixedClusters).
//
// The queue (queue.go): Queue is a name's keys under one prefix, Spec what an acquisition
// asks (the kind of key, which kinds are ahead of it, how many slots). Acquire writes the key
// in one Txn that also reads what is ahead (queue.go), then waits as a queueWaiter
// (waiter.go) subscribed to the client's hub of the name until nothing it must wait for is
// ahead; try.go is the Txn that writes only when nothing is ahead; units.go weighs the keys
// of a semaphore's permits. sentry.go (WatchBehind), releasewatch.go (WatchRelease) and
// observer.go (WatchHead, for elections) are the other subscribers.
//
// Several names at once (multi.go): AcquireAll writes a key on each of several queues in
// one Txn, so that they share one create revision, and waits as a queueWaiter on the hub of
// each name that has a key ahead; TryAcquireAll is its one-Txn try. What it grants is a
// Group (group.go): a Hold per name, lost when any is, released by one Txn of fenced
// deletes.
//
// A hold (hold.go): Hold is a granted key at its create revision, its fencing token. Done,
// Err and OnEnd start its watch (holdmonitor.go: on the client's keyWatch, or a goroutine
// of its own on a client whose KV or Watcher is wrapped); holdrelease.go is the fenced
// delete that ends it (Release, Abandon); holdmetrics.go records its life; scope.go runs
// work scoped to it or to a Group (Do), whose release frees that hold and no later one of the
// handle; unusable.go answers for handles that New did not make.
//
// Around them: retry.go (what is transient, retries, backoff), outlive.go (contexts that
// outlive their caller's), turn.go (a handle's one-at-a-time turn), record.go (a value
// recorded once, as the semaphore's limit).
//
// # The path of an acquisition
//
// A public Lock calls Queue.Acquire(ctx, spec). withSlot takes a live session from the
// client's sharedSession (granting a lease on first use) and claims a slot, which names the
// key. enqueue sends one Txn: put the key on the session's lease if it is absent, and read
// the keys ahead of it. If nothing is in the way, grant makes the Hold at once. Otherwise
// the waiter joins the client's hub of the name, which reads what it missed and feeds it
// every delete (with the deleted key's create revision) until the keys ahead have gone; a
// read confirms the waiter's view after any gap. A cancelled or failed acquisition deletes
// its key, fenced on its create revision, or leaves that to the janitor. Once held, Done
// adds the key to the client's keyWatch; Unlock calls Hold.Release, one fenced delete,
// which ends the hold and takes its key off the keyWatch; the next waiter's hub delivers the
// delete, and so on.
package core
