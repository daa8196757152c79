package rwmutex_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/rwmutex"
)

// A price list that many services read and one updates now and then: readers share the
// lock, a writer has it alone.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	rw, err := rwmutex.New(cli, "pricing-config")
	if err != nil {
		fmt.Println(err)
		return
	}
	// A writer: alone, and its writes fenced like a mutex holder's.
	err = rw.Do(ctx, func(ctx context.Context) error {
		resp, err := cli.Txn(ctx).If(rw.IsOwner()).
			Then(clientv3.OpPut("pricing/eur", "1.08"), clientv3.OpPut("pricing/usd", "1.00")).Commit()
		if err == nil {
			fmt.Println("written under the write lock:", resp.Succeeded)
		}
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Readers: many at once. What they read stands only if RUnlock says nil.
	if err := rw.RLock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	prices, err := cli.Get(ctx, "pricing/", clientv3.WithPrefix())
	if err := rw.RUnlock(ctx); err != nil {
		fmt.Println("a writer may have come in meanwhile:", err)
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("read under the read lock:", len(prices.Kvs), "prices")
	cli.Delete(ctx, "pricing/", clientv3.WithPrefix()) // leave etcd as the example found it
	// Output:
	// written under the write lock: true
	// read under the read lock: 2 prices
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
