// Package once runs a job at most once per period across every process that runs it: cron
// on every host, one run a period. A lock alone is not enough: a job that takes a second
// under it runs again on the next host whose cron fires a second later. A [Job] keeps, beside
// its lock, a record of the last period done, written in a Txn fenced by the hold.
//
// [Job.Run] waits for the name's hold, reads the record under it, and runs fn unless the
// period it is in is recorded done; when fn returns nil it records the period done, in one
// Txn that succeeds only while the hold is held and the record is as Run read it. A fn that
// fails records nothing, so the next Run in the period, on any host, runs it again. A hold
// lost while fn runs ends fn's ctx, and the period is not recorded (Run says [ErrLost]).
//
// # Periods and clocks
//
// Periods are counted from the Unix epoch by the local clock: with a period of an hour, a
// period starts at every whole hour, UTC. The record only moves forward: a Run whose clock
// says an earlier period than the one recorded runs nothing. So clock skew between hosts can
// move a period's run within the period (a host whose clock runs ahead starts the next
// period early, and the others find it done), never make two runs in one period. What
// happens at most once is a successful run: a fn that returned nil but whose record could
// not be written (the hold lost in between, etcd out of reach until ctx ended) may run
// again; make the job idempotent, or fence its own writes with the hold (see package fence).
//
// # Keys
//
// The lock is a mutex on the name (package mutex: the same keys, and the same options). The
// record is one key without a lease beside the name's keys (the name's key prefix without
// its '/', then a NUL byte and "once"), holding JSON: the period's start and length, when the
// run ended, the token of the hold it ran under, and the host and process. `etcdsync once`
// runs a command as a Job of the same name.
package once
