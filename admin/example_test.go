package admin_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/mutex"
)

// A health check that says who runs the nightly report, and who waits for it.
func ExampleStatus() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	// This process runs the report now.
	m, err := mutex.New(cli, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := m.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Unlock(ctx)

	snap, err := admin.Status(ctx, cli, []string{"nightly-report"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range snap.Names[0].Queue { // in the order they are served
		ours := e.Token == m.Token() // e.Owner has the holder's host, pid and since
		fmt.Printf("%d: %s %s (ours: %v)\n", e.Position, e.Kind, e.State, ours)
	}
	// Output: 1: lock holds (ours: true)
}

// A deploy asks the nightly reindex to let go at the end of its current step, rather than
// cut it off: the job runs under a Do that heeds asks.
func ExampleAsk() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	m, err := mutex.New(cli, "nightly-reindex", mutex.WithYieldOnAsk())
	if err != nil {
		fmt.Println(err)
		return
	}
	err = m.Do(ctx, func(work context.Context) error {
		// The operator's side, here for the example: etcdsync status shows the token. Its
		// own ctx: the ask ends work's, perhaps before Ask has its answer.
		if err := admin.Ask(ctx, cli, "nightly-reindex", m.Token(), "deploy at 02:00"); err != nil {
			return err
		}
		for {
			select {
			case <-work.Done(): // asked: stop between steps; Do releases
				var asked *etcdsync.AskedError
				if errors.As(context.Cause(work), &asked) {
					fmt.Println("asked to let go:", asked.Record.Reason)
				}
				return nil
			case <-time.After(10 * time.Millisecond): // a step of the reindex
			}
		}
	})
	fmt.Println("released:", err == nil && m.Err() != nil)
	// Output:
	// asked to let go: deploy at 02:00
	// released: true
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
