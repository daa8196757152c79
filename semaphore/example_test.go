package semaphore_test

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
	"github.com/etcdsync/etcdsync/semaphore"
)

// At most 2 thumbnail jobs run at once, however many processes run them.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	sem, err := semaphore.New(cli, "thumbnailers", 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	var running, done atomic.Int64
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			p, err := sem.Acquire(ctx) // FIFO, within the limit
			if err != nil {
				fmt.Println(err)
				return
			}
			defer p.Release(ctx)
			// The job; fence its writes with p.IsOwner().
			if running.Add(1) > 2 {
				fmt.Println("more than 2 at once") // never
			}
			running.Add(-1)
			done.Add(1)
		})
	}
	wg.Wait()
	fmt.Println("jobs done:", done.Load())
	// The limit stays in etcd, a record without a lease, until deleted.
	if err := admin.Delete(ctx, cli, []string{"thumbnailers"}); err != nil {
		fmt.Println(err)
	}
	// Output: jobs done: 5
}

// A training job needs 4 of a pool's 16 GPUs: it takes them in one permit, all or none, so
// that two such jobs never each hold part of what they need.
func ExampleSemaphore_AcquireN() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	gpus, err := semaphore.New(cli, "gpus", 16)
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := gpus.AcquireN(ctx, 4)
	if err != nil {
		fmt.Println(err)
		return
	}
	inUse, err := gpus.InUse(ctx)
	if err != nil {
		fmt.Println(err)
	}
	fmt.Printf("holding %d of %d; %d in use\n", p.Units(), gpus.Limit(), inUse)
	if err := p.Release(ctx); err != nil { // all 4 at once
		fmt.Println(err)
	}
	if err := admin.Delete(ctx, cli, []string{"gpus"}); err != nil { // the limit's record
		fmt.Println(err)
	}
	// Output: holding 4 of 16; 4 in use
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
