// Package election is leader election on etcd: candidates campaign on a name, the one that
// campaigned first among those alive leads, and observers follow who leads and what the
// leader proclaims.
//
// A campaign writes one key "<name>/<lease hex>_<n>" holding the candidate's value, bound
// to the lease that the primitives on the client share (see package etcdsync, which also
// holds the options and errors); the leader is the live key with the lowest create
// revision. For a name without '/' and '%' that is how etcd's concurrency.Election and
// `etcdctl elect` lay out and choose the leader, so they and this package see the same
// leader on the same name and wait for one another; other names are escaped, so that "a",
// "a/b" and "ab" never meet.
//
// [Election.Run] is the leader loop: lead's ctx ends the moment the leadership is lost
// (context.Cause matches [ErrLost]), or a [WithHealthCheck] check fails; Run resigns only
// after lead has returned, so leadership is never given up under lead and never kept
// without it for longer than the Resign takes. It campaigns again after a loss, a failed
// check (once the check passes again), or a lead that returned nil; a lead that returns an
// error stops it, after resigning; a campaign that fails with ErrLost (an outage) is tried
// again after half a second, with a new lease. Every term is a hold in the metrics, and its
// end counts in etcdsync.leader.stepdowns by cause.
//
// The leadership can be handed over in place: [Election.Transfer] gives it to a chosen
// candidate ahead of the others, who keep their order behind it; [WithPreference] makes a
// Run's leader do so by itself for a more preferred candidate that has waited a settle time;
// [Election.RequestTransfer] (and `etcdsync transfer`) asks the leader from anywhere, and a
// Run heeds it. The leader's key stays where it is, the oldest of the name: one Txn moves it
// onto the candidate's lease with the candidate's value, so etcd's own Election, `etcdctl
// elect` and the candidates passed over see one more leader and keep waiting. The fencing
// token passes with the key: the successive leaders' tokens never decrease, and increase
// at every change of leader but a transfer, where the key and its token move from a leader
// that has stopped (Run ends lead first) to the candidate. A compare that the old leader
// made before its transfer is the new leader's too: stop the leader's writes before
// Transfer, as Run does.
//
// One handle is one candidate: several Runs, or Runs and Campaigns, on one [Election] take
// turns. A Run's term keeps the handle's turn until its lead has returned, also after a
// loss, so no other Run or Campaign of the handle leads while a lead of it may still act;
// Run then resigns its own term's leadership only, never a later one of the handle. A
// Resign by another call also ends lead's ctx (its cause matches [ErrNotLocked]).
//
// Leadership is not a fence: a leader that pauses (GC, swap, a stopped VM) may wake after its
// lease expired and another candidate took over, with nothing to tell it in time. Guard every
// write the leader makes with [Election.IsOwner] in the same Txn, or with [Election.Token]
// where the storage can compare tokens, so that a deposed leader's writes fail.
//
// See Example, and examples/leader for a program.
package election
