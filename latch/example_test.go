package latch_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/latch"
)

// A deploy goes on once its 3 canaries have reported healthy: each counts the latch down
// once, by its own name, however often it retries; any number of processes wait.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	l, err := latch.New(cli, "deploy-42/canaries")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The deploy sets the count once; a second Set says ErrAlreadySet.
	if err := l.Set(ctx, 3); err != nil {
		fmt.Println(err)
		return
	}
	// Each canary, once healthy, in a process of its own.
	var canaries sync.WaitGroup
	for _, canary := range []string{"web-1", "web-2", "web-3"} {
		canaries.Go(func() {
			if err := l.CountDownAs(ctx, canary); err != nil {
				fmt.Println(err)
			}
		})
	}
	// The deploy, and anyone else, waits for zero.
	err = l.Await(ctx)
	canaries.Wait()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("canaries healthy: deploying")
	// The count stays in etcd, without a lease, until deleted.
	if err := l.Delete(ctx); err != nil {
		fmt.Println(err)
	}
	// Output: canaries healthy: deploying
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
