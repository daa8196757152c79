package election_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
)

// One replica of a billing service leads, and its writes land only while it does.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	e, err := election.New(cli, "billing-leader")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := e.Campaign(ctx, "replica-1"); err != nil { // waits until this replica leads
		fmt.Println(err)
		return
	}
	// Fenced work: it applies only while this replica leads.
	resp, err := cli.Txn(ctx).If(e.IsOwner()).
		Then(clientv3.OpPut("billing/last-run", "2026-11-24")).Commit()
	if err != nil {
		fmt.Println(err)
	} else {
		fmt.Println("written as leader:", resp.Succeeded)
	}
	if l, err := e.Leader(ctx); err == nil { // what every replica, and Observe, sees
		fmt.Println("leader:", l.Value)
	}
	if err := e.Resign(ctx); err != nil {
		fmt.Println(err)
	}
	cli.Delete(ctx, "billing/", clientv3.WithPrefix()) // leave etcd as the example found it
	// Output:
	// written as leader: true
	// leader: replica-1
}

// A rolling upgrade: the new version's replicas campaign with a higher preference, and the
// old leader's Run hands its leadership to one of them once it has waited the settle time
// (10 s without WithSettle). An operator can also move it by hand (RequestTransfer, or
// etcdsync transfer).
func ExampleWithPreference() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()

	// replica runs the leader loop of a replica of the given version (each in a process of
	// its own, in real life) until stop.
	replica := func(value string, version int, lead func(ctx context.Context) error) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			e, err := election.New(cli, "billing-leader",
				election.WithPreference(version), election.WithSettle(100*time.Millisecond))
			if err == nil {
				err = e.Run(ctx, value, lead)
			}
			if !errors.Is(err, context.Canceled) {
				fmt.Println(err)
			}
		}()
		return func() { cancel(); <-done }
	}
	oldLeads, newLeads := make(chan struct{}), make(chan struct{})
	stopOld := replica("replica-1 v1", 1, func(ctx context.Context) error {
		fmt.Println("replica-1 v1: leading")
		close(oldLeads)
		<-ctx.Done() // a loss, a hand-over to a more preferred candidate, or the end of Run
		fmt.Println("replica-1 v1: handing over")
		return nil
	})
	<-oldLeads
	stopNew := replica("replica-7 v2", 2, func(ctx context.Context) error {
		fmt.Println("replica-7 v2: leading")
		close(newLeads)
		<-ctx.Done()
		return nil
	})
	<-newLeads
	stopOld() // the old version's replicas go away, then the example ends
	stopNew()
	// Output:
	// replica-1 v1: leading
	// replica-1 v1: handing over
	// replica-7 v2: leading
}

// Only the leader serves the reports API: the other replicas answer 503 and name the
// leader, whom a caller may try instead. Readiness stays apart from leadership: /readyz
// says whether this replica can serve at all (here: whether it reaches etcd), so that a
// rolling update does not wait on the replicas that do not lead.
func ExampleElection_Handler() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	replica := func(e *election.Election) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/reports", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "the reports")
		})))
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if _, err := cli.Get(ctx, "readyz", clientv3.WithCountOnly()); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		return mux
	}
	leading, err := election.New(cli, "reports-leader")
	if err != nil {
		fmt.Println(err)
		return
	}
	other, err := election.New(cli, "reports-leader") // another replica's handle
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := leading.Campaign(ctx, "http://10.0.0.1:8080"); err != nil {
		fmt.Println(err)
		return
	}
	get := func(h http.Handler, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w
	}
	w := get(replica(leading), "/reports")
	fmt.Println("leader:", w.Code)
	w = get(replica(other), "/reports")
	fmt.Println("other:", w.Code, w.Header().Get(election.LeaderHeader))
	fmt.Println("other ready:", get(replica(other), "/readyz").Code)
	if err := leading.Resign(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// leader: 200
	// other: 503 http://10.0.0.1:8080
	// other ready: 200
}

// exampleEndpoints are the etcd members the examples run on, from ETCDSYNC_EXAMPLE_ENDPOINTS
// (comma-separated); internal/testkit/exampletest sets it to an etcd it embeds. Without it
// there are none, and clientv3.New fails at once.
func exampleEndpoints() []string {
	return strings.FieldsFunc(os.Getenv("ETCDSYNC_EXAMPLE_ENDPOINTS"), func(r rune) bool { return r == ',' })
}

// Without ETCDSYNC_EXAMPLE_ENDPOINTS, go test skips the examples, which need an etcd: it
// compiles them only. An init does it, so that the examples need no TestMain of their own.
func init() {
	testing.Init() // registers go test's flags now; its own call later does nothing
	if os.Getenv("ETCDSYNC_EXAMPLE_ENDPOINTS") == "" {
		_ = flag.Set("test.skip", "^Example")
	}
}
