package barrier_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/barrier"
)

// Each of 3 workers, in any processes (here goroutines, a Barrier each), starts a stage of
// a job only once all 3 are there, and goes on to the next stage only once all 3 are done
// with this one.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	const workers, stages = 3, 2
	var finished [stages]atomic.Int64 // workers done with each stage
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			b, err := barrier.New(cli, "nightly-shards", workers)
			if err != nil {
				fmt.Println(err)
				return
			}
			for stage := range stages {
				if err := b.Enter(ctx); err != nil { // once all 3 have entered
					fmt.Println(err)
					return
				}
				if stage > 0 && finished[stage-1].Load() != workers {
					fmt.Println("a stage began before the one before it ended") // never
				}
				finished[stage].Add(1) // the stage's work
				// Leave in any case: the others wait for every participant of the round.
				if err := b.Leave(ctx); err != nil { // once all 3 have left
					fmt.Println(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Println("workers done with each stage:", finished[0].Load(), finished[1].Load())
	// The name's size and rounds stay in etcd, records without a lease, until deleted.
	if err := admin.Delete(ctx, cli, []string{"nightly-shards"}); err != nil {
		fmt.Println(err)
	}
	// Output: workers done with each stage: 3 3
}

// Workers wait at a gate until a coordinator has migrated the schema.
func ExampleGate() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	g, err := barrier.NewGate(cli, "schema-migrated")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The coordinator holds the gate before any worker starts.
	if err := g.Hold(ctx); err != nil {
		fmt.Println(err)
		return
	}
	var migrated atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if err := g.Wait(ctx); err != nil { // at once if released already
				fmt.Println(err)
				return
			}
			fmt.Println("worker starts; schema migrated:", migrated.Load())
		})
	}
	migrated.Store(true) // the migration
	err = g.Release(ctx)
	wg.Wait()
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// worker starts; schema migrated: true
	// worker starts; schema migrated: true
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
