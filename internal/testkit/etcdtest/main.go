package etcdtest

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// leakPatience is how long Main lets goroutines end on their own after Close before it calls
// them leaked. Embedded members talk HTTP to each other over connections with a 5 s read
// deadline (rafthttp.ConnReadTimeout), re-armed by every Read, which can beat net/http's own
// attempt to cut a read short: the server and client goroutines of a peer connection that was
// serving a request at Close end only when that deadline passes, up to 5 s after Close.
// goleak.Find alone waits about half a second, and goleak v1.3.0 cannot be told to wait longer.
const leakPatience = 10 * time.Second

// knownServerLeaks are goroutines of embedded etcd members that etcd itself strands, which no
// code of ours can end:
//
//   - etcd-io/etcd#22189: a member being stopped closes its backend while its peer HTTP
//     handlers still serve. A peer's /version request in that window panics on the closed
//     bolt transaction inside the backend's read lock; net/http recovers the panic, the lock
//     stays held, and the next /version handler on that member blocks on it for good.
//   - A member's peer prober (rafthttp, through github.com/xiang90/probing) that a peer
//     connection added while the member stopped: it sends a health request to a peer
//     that was paused or cut off, and its HTTP connection's goroutines wait on it, with no
//     deadline (seen once, in rwmutex's fault suite on 2026-11-27). etcdsync's clients
//     speak gRPC, never net/http, so no goroutine of ours has these frames.
var knownServerLeaks = []goleak.Option{
	goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
	goleak.IgnoreAnyFunction("github.com/xiang90/probing.(*prober).AddHTTP.func1"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
}

// serverGoroutines are the roots of the embedded members' own goroutines. The members start
// serving a moment after the cluster reports ready, so the goroutines a test snapshots with
// goleak.IgnoreCurrent may not include them yet; they are etcd's, never a client's.
var serverGoroutines = []goleak.Option{
	goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/embed.(*serveCtx).startHandler.func1"),
	goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver.(*EtcdServer).GoAttach.func1"),
	// The member's HTTP server reading a client connection it accepted through cmux: it ends
	// once the server sees the closed connection, a moment after the client's Close.
	goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
}

// NoNewGoroutines fails tb if a goroutine that since (goleak.IgnoreCurrent, taken earlier)
// did not know is still running after goleak's retries: what a client or a primitive left
// behind. The embedded members' goroutines are not counted (see serverGoroutines).
func NoNewGoroutines(tb testing.TB, since goleak.Option) {
	tb.Helper()
	opts := append([]goleak.Option{since}, serverGoroutines...)
	goleak.VerifyNone(tb, append(opts, knownServerLeaks...)...)
}

// Main is a TestMain body: it starts New(1) into *c, runs the tests, closes the cluster, then
// checks with goleak that no goroutine outlived it, ignoring only knownServerLeaks. It exits
// non-zero on a test failure or a leak, printing the leaked goroutines, and exits 1 if the
// cluster cannot start. m is a *testing.M, or one wrapped in a Run that starts and stops
// servers of the package's own around the tests.
func Main(m goleak.TestingM, c **Cluster) {
	runMain(m, c, func() (*Cluster, error) { return New(1) })
}

// MainWith is Main with a cluster of the caller's making (TLS, auth), its own: in the short
// tier against ETCD_ENDPOINTS the package's tests are skipped, as OwnMembers skips a test.
func MainWith(m goleak.TestingM, c **Cluster, start func() (*Cluster, error)) {
	flag.Parse()
	if shortAgainstExternal() {
		fmt.Println("etcdtest: every test here runs on members of its own: not in the short tier against ETCD_ENDPOINTS")
		os.Exit(0)
	}
	runMain(m, c, start)
}

func runMain(m goleak.TestingM, c **Cluster, start func() (*Cluster, error)) {
	cluster, err := start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest: cannot start etcd: %v\n", err)
		os.Exit(1)
	}
	*c = cluster
	code := m.Run()
	closeShared() // first: the package's cluster is then the last in the process (see Close)
	cluster.Close()
	if err := findLeaks(); err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest: goroutines leaked: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// findLeaks runs goleak.Find, which itself retries for a while, until it finds no leak or
// leakPatience has passed.
func findLeaks() error {
	deadline := time.Now().Add(leakPatience)
	for {
		err := goleak.Find(knownServerLeaks...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}
