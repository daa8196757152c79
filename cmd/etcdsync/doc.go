//go:build unix

// Etcdsync runs a command under a lock, a read lock, a semaphore permit or leadership held
// in etcd, and shows who holds each name and who waits for it.
//
// Usage:
//
//	etcdsync lock   [flags] NAME [-- CMD [ARGS...]]
//	etcdsync rlock  [flags] NAME [-- CMD [ARGS...]]
//	etcdsync sem -n N [flags] NAME [-- CMD [ARGS...]]
//	etcdsync elect  [--value V] [--loop] [flags] NAME [-- CMD [ARGS...]]
//	etcdsync status [--prefix P] [--json] [--watch] [--kind lock|election] [NAME...]
//
// lock, rlock, sem and elect wait their turn (first come, first served), run CMD directly
// (through /bin/sh -c only with --shell) in a process group of its own, release when it
// exits and exit with its status. The command's environment has ETCDSYNC_NAME,
// ETCDSYNC_KEY and ETCDSYNC_TOKEN (the key's create revision, its fencing token). If the
// hold is lost (its lease's local deadline passed, its key was deleted, its lease revoked)
// the whole group gets SIGTERM at once and SIGKILL after --grace, and etcdsync exits 125.
// SIGINT, SIGTERM and SIGHUP are passed on to the group; etcdsync releases once the command
// has exited and no process of its group is left. Without CMD, etcdsync holds until
// interrupted, after printing the name, key and token.
//
// Exit status: the command's, 128+N if it died of signal N; 64 usage, 69 etcd unreachable or
// refusing, 75 busy (--try), 124 --timeout, 125 hold lost, 126 command not runnable, 127
// command not found, 128+N interrupted by signal N while waiting.
//
// etcd is reached as etcdctl reaches it: --endpoints, --cacert, --cert, --key, --user,
// --password, --dial-timeout, --command-timeout, --insecure-skip-tls-verify, or the
// ETCDCTL_* variable of each. `etcdsync help COMMAND` shows a command's flags and an example.
//
// etcdsync runs on Unix systems (process groups and their signals); on Linux it is a child
// subreaper, so that it waits for every process of its command's group.
package main
