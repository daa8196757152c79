//go:build unix

// Etcdsync runs a command under a lock, a read lock, a semaphore permit or leadership held
// in etcd, and shows who holds each name and who waits for it; it also starts commands
// together at a double barrier, and counts down latches.
//
// Usage:
//
//	etcdsync lock     [flags] NAME [NAME...] [-- CMD [ARGS...]]
//	etcdsync rlock    [flags] NAME [-- CMD [ARGS...]]
//	etcdsync sem      -n N [--units K] [flags] NAME [-- CMD [ARGS...]]
//	etcdsync elect    [flags] NAME [PROPOSAL] [-- CMD [ARGS...]]
//	etcdsync once     --every D [flags] NAME [--] CMD [ARGS...]
//	etcdsync transfer [--to VALUE] [flags] NAME
//	etcdsync barrier  -n N [flags] NAME [-- CMD [ARGS...]]
//	etcdsync latch    [flags] NAME (--set N|--down|--wait|--count|--delete)
//	etcdsync status   [--json] [--watch | --check] [flags] [NAME...]
//	etcdsync release  --token T [--reason R] [flags] NAME... | --ticket TICKET
//	etcdsync ask      --token T [--reason R] [flags] NAME
//	etcdsync renew    [flags] TICKET
//	etcdsync delete   [flags] NAME...
//	etcdsync help     [COMMAND]
//	etcdsync version
//
// lock, rlock, sem and elect wait their turn (first come, first served), run CMD directly
// (through /bin/sh -c only with --shell) in a process group of its own, release when the
// group is gone and exit with CMD's status. CMD follows NAME as etcdctl lock takes it
// (lock NAME CMD ARGS...), or a "--" after NAME (lock NAME -- CMD ARGS...). The command's
// environment has ETCDSYNC_NAME, ETCDSYNC_KEY and ETCDSYNC_TOKEN (the key's create
// revision, its fencing token). If the hold is lost (its lease's local deadline passed,
// its key was deleted, its lease revoked) the whole group gets SIGTERM at once and SIGKILL
// after --grace, and etcdsync exits 125; at --max-hold too, but the hold is kept until the
// group is gone and released then (exit 123), so the next holder's command never runs
// beside it. etcdsync's first SIGINT, SIGTERM or SIGHUP goes to the group and starts
// --grace too; a second signal sends SIGKILL at once; etcdsync then exits 128+N, N the
// first signal, whatever the command's status. Without CMD, etcdsync holds until
// interrupted, after printing the name, key and token (elect: the leader's key and value,
// as etcdctl elect prints them). lock of several names holds all of them at once or none
// (mutex.Multi: one key per name, one token), and needs a "--" after the last name;
// ETCDSYNC_NAME and ETCDSYNC_KEY then list the names and keys one per line. elect NAME
// PROPOSAL campaigns with PROPOSAL as its value, as etcdctl elect does (or --value V), and
// takes CMD only after "--". sem -n N on a name whose limit etcd records at another N runs
// under etcd's, with a warning. lock --detach
// prints a ticket and exits, leaving the hold for its --ttl: renew TICKET renews it once,
// release --ticket TICKET releases it. transfer asks an election's leader (elect, or a Go
// Run) to stop its command and hand the leadership to the candidate of --to VALUE, or to
// step down; elect --prefer N makes a leader of a lower N do so by itself once this
// candidate has waited --settle. status shows what each name is (lock, rwmutex,
// semaphore, election, barrier, latch; an election told by its candidates' values, or by
// --kind), who holds and who waits; without NAME, every name at the root of the keyspace,
// or under --prefix. --json (or -w json, as etcdctl) writes it as JSON.
//
// barrier -n N NAME enters the double barrier of N participants on NAME (package barrier),
// runs CMD once N have entered, as lock runs its CMD, then leaves and waits until every
// participant of its round has left, and exits with CMD's status; without CMD it enters
// and leaves at once, a rendezvous point. CMD's environment has ETCDSYNC_NAME and
// ETCDSYNC_ROUND, the round's number, and no ETCDSYNC_KEY or ETCDSYNC_TOKEN: a barrier
// gives no fencing token. latch NAME sets (--set N), counts down (--down, once per
// participant with --as ID), awaits (--wait), prints (--count) or deletes (--delete) the
// countdown latch NAME (package latch).
//
// once --every D NAME CMD runs CMD at most once per period D across every host (package
// once): under the lock NAME it reads the record of the last period done, exits 0 at once
// if the period the local clock is in is done, and else runs CMD (with ETCDSYNC_PERIOD, the
// period's start) and records the period done, fenced by the hold, when CMD exits 0.
//
// Exit status: the command's, 128+N if it died of signal N (with --command-failed N, N for
// every status but 0); 0 without CMD, released on a signal, and for elect after a
// transfer; 1 transfer, latch: nothing changed (latch --wait: the latch was deleted); 64
// usage, 69 etcd unreachable or refusing, 75 busy (--try), 123 --max-hold passed, 124
// --timeout, 125 hold (a barrier's participant) lost, 126 command not runnable, 127
// command not found, 128+N signal N while waiting or stopping the command.
//
// etcd is reached as etcdctl reaches it: --endpoints, --cacert, --cert, --key, --user,
// --password, --dial-timeout, --command-timeout, --insecure-skip-tls-verify, or the
// ETCDCTL_* variable of each. `etcdsync help COMMAND` shows a command's flags and an example;
// `etcdsync version` (or --version) the module's version and Go's.
//
// etcdsync runs on Unix systems (process groups and their signals); on Linux it is a child
// subreaper, so that it waits for every process of its command's group.
package main
