// Package realbench compares our primitives with etcd's own on real etcd server processes,
// which sync every commit to disk, against the cluster's sequential commit rate measured in
// the same rounds. It holds only benchmarks (and a test of their harness):
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/testkit/realbench/
//
// The cluster is ETCD_ENDPOINTS ("host:port,host:port") if it is set, and only that one;
// otherwise, when an etcd server binary is found ($ETCDTEST_ETCD, or etcd on PATH), one of
// 1 member and one of 3 members, started as processes on free loopback ports with etcd's
// default fsync, for the sub-benchmarks members=1 and members=3, and stopped at the end.
// Without either every benchmark skips. Client i is pinned to member i modulo the size.
//
// A sub-benchmark runs rounds (3, or ETCDSYNC_BENCH_ROUNDS) of the same length (2 s, or
// ETCDSYNC_BENCH_ROUND) for each side in turn: ours, then etcd's (etcd's first in even
// rounds), then one client Putting a key after another on the leader, and on a follower
// when there are several members. One b.N iteration is all the rounds, so b.N stays 1 with
// the default -benchtime and ns/op is the time of all rounds: read the custom metrics,
// which report (rounds_test.go) lists, and the line each sub-benchmark logs with every
// round's figures.
package realbench
