package etcdsync_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/mutex"
)

// A service's primitives, of any package, take the options of this one, and share one
// lease per client and TTL. Shutdown revokes it as the service exits, so that the holds it
// still has end at once instead of a TTL later.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	opts := []etcdsync.Option{etcdsync.WithPrefix("billing/"), etcdsync.WithTTL(15 * time.Second)}
	e, err := election.New(cli, "leader", opts...)
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := mutex.New(cli, "invoices", opts...)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := e.Campaign(ctx, "replica-1"); err != nil {
		fmt.Println(err)
		return
	}
	if err := m.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// The service exits while it leads and holds the lock. In main, defer Shutdown after
	// cli.Close, so that it runs first.
	if err := etcdsync.Shutdown(ctx, cli); err != nil {
		fmt.Println(err)
	}
	<-e.Done()
	<-m.Done()
	fmt.Println("election:", e.Err())
	fmt.Println("mutex:", m.Err())
	// Output:
	// election: etcdsync: lost: the session's lease was revoked by Shutdown
	// mutex: etcdsync: lost: the session's lease was revoked by Shutdown
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
