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
//
// A side may instead do a fixed piece of work per run, prepared beforehand outside the
// round (BenchmarkFleetDrain: N clients each queue one waiter behind a holder, and a run is
// the queue drained): its round is as many prepared runs as fill the round's length, and
// only the runs are timed, counted and observed. It runs 8, 32 and 128 clients;
// ETCDSYNC_BENCH_FLEET (e.g. 1000) adds more.
//
// Besides the rates and the RPCs per op, each side reports what it cost, per headline op
// (per cycle, read, write, permit, term; per commit for "leader" and "follower") over all of
// its rounds, dividing by every op of a round, also those under way at its end. The server
// figures come from every member's Prometheus metrics (GET <client URL>/metrics), read just
// before and just after each of the side's rounds; the leader is the member that led at the
// start of the sub-benchmark:
//
//   - "<side>-syncs/<op>": WAL fsyncs on the leader (etcd_disk_wal_fsync_duration_seconds_count)
//     per op, and "<side>-sync-ms/sync" the mean time of one (its _sum over its _count), in ms.
//     One commit costs one sync when etcd syncs no two together.
//   - "<side>-proposals/<op>": raft proposals committed on the leader
//     (etcd_server_proposals_committed_total) per op: the writes an op makes, about 2 a lock
//     cycle (a Txn to lock, one to unlock) and 1 a commit.
//   - "<side>-etcdCPU-ms/<op>": the CPU of the etcd processes (process_cpu_seconds_total),
//     user and system, summed over every member, in ms per op; "<side>-leaderCPU-ms/<op>"
//     the leader's alone. etcd counts it in clock ticks (10 ms a member), so short rounds of
//     few ops read coarsely; it includes what serving /metrics costs around each round.
//   - "<side>-clientCPU-ms/<op>": the CPU of the test process (getrusage RUSAGE_SELF, user
//     and system) over the side's round, in ms per op. It counts every goroutine of the
//     process, which during a round are that side's clients (and the other sides' idle
//     ones: lease keep-alives, the gRPC runtime, the Go runtime).
//
// If a member's /metrics cannot be read (an external cluster that serves its metrics
// elsewhere, or over TLS the benchmarks hold no certificate for), the server figures are
// left out and the logged line says why; the benchmark goes on. A single round whose
// reading failed is left out of them likewise, and counted in the line.
package realbench
