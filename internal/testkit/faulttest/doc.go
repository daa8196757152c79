// Package faulttest runs a locking primitive through faults of a 3-member etcd cluster and
// checks what its users rely on: fenced writes are never lost nor doubled, holds whose
// release succeeded never overlap, the recorded history is linearizable against a lock
// guarding a fenced register (porcupine), a waiter is served soon after each fault heals,
// and no key is left behind.
//
// A primitive plugs in with a Workload: how to open a handle (a Locker: Lock, Unlock,
// Token, IsOwner) on a client, the key prefix of a name, the lease TTL, how many may hold at
// once (Slots) and the error Unlock returns for a lost hold. Then
//
//	func TestFault(t *testing.T) { faulttest.Suite(t, workload) }
//
// runs it through every Fault, one subtest each, on one Env (the cluster, with a proxy in
// front of every member's peer port and of every client). With ETCDSYNC_SOAK=10m it runs
// them over and over for ten minutes. The parts can be used alone: Env.Start runs the
// workload (4 workers on clients spread over the members, readers if any, and background
// writes), a Fault disturbs it, Run.Verify checks the History.
//
// A semaphore with limit n plugs in with Slots: n. Each hold fences its writes with its own
// IsOwner; the model lets up to n tokens hold at once (evicting any one when a new one
// comes, as a lease expiry would), and no more than n holds released cleanly may overlap.
// The register check that needs exclusion (a write must find the value its holder read)
// applies only with one slot; with more, each write also compares the register's revision,
// so concurrent holders do not lose each other's increments and the count still must match.
// The write lock of an rwmutex and an election's leadership plug in with one slot. An
// rwmutex's read side plugs in beside its write side with Workload.OpenReader (a Reader:
// RLock, RUnlock): reader workers, two on each of two handles, take read holds and read the
// register under them; no read hold released cleanly may overlap a write hold released
// cleanly, and a reader too must be served soon after each fault heals. Read holds may
// overlap one another; the porcupine model has no readers.
package faulttest
