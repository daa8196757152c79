// Package core is the one implementation behind every etcdsync primitive: names and
// keys, options, the shared session layer, and a wait-for-predecessor queue ordered by
// create revision whose holds report their own loss.
//
// Public packages adapt it to their vocabulary. Each idea lives in one file; the map lists
// them from the ground up, and a file mostly uses the files above it in the list (the test
// internal/testkit/shapetest counts the uses that do not, and bounds them):
//
//   - errors.go: the sentinel errors every package re-exports, handles New did not make;
//     what is transient, retries and backoff, bounded tries, CommitWrite (every write of a
//     record, tried again until its answer is known), and contexts that outlive their
//     caller's for a bounded time.
//   - session.go: the shared sessions (a lease per client and TTL, replaced after it
//     expired, and once it carries maxLeaseKeys keys; Shutdown) and their keep-alive with
//     its local deadline.
//   - keys.go: what a key is, written once: the layout under a name's prefix (its kinds
//     and records), a name's escaped prefix (ValidateName, NamePrefix), the slot of an
//     acquisition ("<prefix><kind><lease hex>_<slot>", reused from one acquisition to the
//     next), the one parse of a holder's or waiter's key (ParseKey), the value written into
//     it (OwnerValue) and the mode in that value (ModeOf, WithMode), a limit's marker; what
//     a name is used as (a lock, an election, an rwlock, a semaphore, a barrier, a gate, a
//     latch), the sub-ranges each owns, and the guard every write of one compares so that a
//     name of another kind refuses it (Claim, ErrOtherKind).
//   - options.go: Option and Config (TTL, session, prefix, meter), the options each kind of
//     primitive takes (OptionsFor: any other is refused), and where a handle's sessions come
//     from (SessionsFor: the client's shared ones, or the caller's WithSession).
//   - telemetry.go: the instruments, spans and attribute sets of a handle (Telemetry, one
//     Attempt per call).
//   - client.go: a client's state, one per *clientv3.Client, dropped when the client closes
//     (its shared sessions, hubs, keyWatch, janitor and clock); the clock (the highest
//     revision seen, the rewind of every hold when the cluster went back in time, answers
//     from more than one cluster); the janitor (cleanups that outlive the call that needed
//     them); and what the tests in internal/testkit reach inside the core for (the library
//     never calls it).
//   - hub.go: one watch per client, name and mode, shared by every subscriber there: join,
//     leave and linger (for a while, or a few releases); events dispatched in revision
//     order, once; a read after any gap.
//   - queue.go: Queue (a name's keys under one prefix) and Spec (what an acquisition asks:
//     the kind of key, which kinds are ahead of it, how many units of how many); the weight
//     of a semaphore's keys; the spec of each kind of key (LockSpec, ReadSpec, PermitSpec,
//     ...), for the primitives and admin alike; Served, the one rule of who is served;
//     Record.
//   - follow.go: the one way to wait for a state of a few keys (a round filled, a count at
//     zero, a record answered, a key gone): watch them from the present, read the state,
//     take the events after the read, and watch and read again after any gap (ReadState,
//     Follow, followAll over several ranges, AwaitGone for one key's end: exported, so that
//     a primitive's own algorithm waits as the core does, as package barrier's); and the approach
//     of a waiter far back in line, on a client with no hub of the name, which follows the
//     few keys a few places ahead of it that weigh its threshold and joins the hub once
//     enough of them are gone. Besides these a wait is the hub's (a name's line) or the
//     hold's key watch (its loss); nothing else in the library watches.
//   - records.go: the records beside a name: a semaphore's limit (its record and marker,
//     read as they may change while permits are held and waited for; package semaphore's
//     SetLimit changes them), a countdown latch's layout (a record of the count, and a
//     marker per count down; package latch sets, counts down and awaits them on Record and
//     Follow), and where a once job's record of the last period done lies (OnceRecordKey;
//     package once reads and writes it).
//   - hold.go: Hold, a granted key at its create revision (its fencing token), its state and
//     its end; how its loss is watched (on the client's keyWatch, or by a monitor of its own
//     on a client whose KV or Watcher is wrapped); Asked, closed once it is asked to let go.
//   - handle.go: a handle's one-at-a-time turn, handed over in order (Turn); work scoped to
//     a hold or a Group (Do), whose release frees that hold and no later one, and whose
//     fn's ctx ends when the hold is asked to let go (WithYieldOnAsk); the Shell every
//     primitive's handle is built on: the check of a handle New did not make or a closed
//     client, the label of its errors, the telemetry of its calls (Begin, Start).
//   - watchers.go: the hub's subscribers: the view they share, queueWaiter (an acquisition
//     that waits), Sentry (WatchBehind), keeper (a hold's key, for its loss, on the hub
//     that heard it served: joinNear) and Observer (WatchHead, for elections).
//   - mode.go: a hold that changes what it is in place (rwmutex Downgrade, the upgradable
//     read): who passes which mode (Spec.Passes), the change (ChangeMode), and an upgrade
//     that every client agrees on (Upgrade); a change refused while a waiter of etcd's
//     recipe.RWMutex is queued behind (ErrRecipeBehind).
//   - life.go: a hold's life beyond its lease: its maximum (WithMaxHold, a timer per hold)
//     and the lock-delay a waiter keeps after a predecessor whose lease went
//     (WithLockDelay); an operator's release (admin.Release), the record it leaves and how a
//     holder or waiter whose key went reads it (ErrReleasedByOperator); the metrics of a
//     hold's life and the cause of its end.
//   - keywatch.go: the client's one watch stream for the keys of its holds: each create
//     under a fresh ID, a watch cancelled or refused has its key read first, the holds of
//     a lease that ended told at once; a hold its waiter's hub heard served is watched by
//     that hub instead (a keeper), and by the stream once the hub fails it.
//   - release.go: Group, the Holds of one acquisition of several names, which end as one;
//     the release of a hold or a Group, one fenced delete (release, deleteFenced); an ask
//     that a hold let go (admin.Ask): its record, followed from the hold's first Asked
//     (follow), and deleted by the release of a hold that was told of it.
//   - acquire.go: the acquisition path, once for one name and for several: claim a slot per
//     name, write every key in one Txn that reads what is ahead (acquisition.write: every
//     write of an acquisition, and what each answer means), wait, grant or abandon; a key
//     that waits for nobody (Join).
//   - try.go: an acquisition that does not wait (TryAcquire): one Txn, or a count and a
//     put when a key may have others ahead of it (a semaphore's); the guard of a name's use;
//     what fits in one Txn (MaxNames, FitOneTxn); ReleaseWatch (WatchRelease, for one name
//     or several), a hub's subscriber that wakes a retry of a failed try.
//   - ticket.go: a hold that outlives its process: Detach onto a lease of its own, the
//     Ticket, Resume (once per ticket), and the command's renewal and release by ticket.
//   - handover.go: an election's leadership handed to a chosen candidate (Transfer): the
//     protocol, the record of a handover and its stages (HandoverRecord), the leader's
//     errors and wait (ErrNoCandidate, HandoverWait); a candidate's preference in its key;
//     the candidate's side, which answers a proposal that deleted its key, follows the
//     record until the leader hands over, and accepts; a hold handed over (HandedOver) or
//     dropped (Drop). The leader's side (propose, hand over, take back) is package
//     election's.
//   - asks.go: what asks a leadership to move: a request that the leader transfer
//     (RequestTransfer) and its answer, an ask of its key (admin.Ask), a preferred candidate
//     that has waited its settle time, followed for the leader (FollowAsks, on followAll).
//   - barrier.go: a double barrier's record of rounds (slices of its participants' create
//     revisions), read by package barrier, whose algorithm joins participants at once
//     (Queue.Join), and by admin.
//
// Process-wide state: the clients' states (client.go), by client; the slots claimed, by
// lease (keys.go), which is process-wide because one lease can be used through several
// handles' sessions (WithSession) and clients; the instruments of each MeterProvider,
// whose etcdsync.hold.oldest sees the live holds counted there, and the Telemetry of the
// global MeterProvider by primitive (telemetry.go): caches.
//
// # The path of an acquisition
//
// A public Lock calls Queue.Acquire(ctx, spec); mutex.Multi calls AcquireAll over several
// queues, the same path. withAcquisition takes a live session from the client's shared
// session (granting a lease on first use) and claims a slot per name, which names the key.
// enqueue sends one Txn: put the keys on the session's lease if they are absent, and read
// what is ahead of each. If nothing is in the way, grant makes the Hold (or Group) at once.
// Otherwise wait joins the client's hub of each name with something ahead, which reads what
// it missed and feeds the waiter every delete (with the deleted key's create revision) until
// little enough is ahead; a read confirms the waiter's view after any gap. A waiter far
// back with no hub of the name on its client (and few other waiters of the name there)
// approaches first: it watches the keys a few places ahead of it that weigh its threshold
// and joins the hub once enough are gone. A cancelled or failed acquisition deletes its
// keys, fenced on their create revision, or leaves that to the janitor. Once held, Done adds
// the key to the client's keyWatch (which leaves a hold its waiter's hub heard served to
// that hub); Unlock calls Hold.Release, one fenced delete, which ends the hold and takes its
// key off the keyWatch; the next waiter's hub delivers the delete, and so on.
package core
