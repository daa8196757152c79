package reentrant_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/reentrant"
)

// A catalog rebuild locks at every level of its recursion with the context of the level
// above: the first Lock takes the lock, the nested ones re-enter it with no round trip.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	m, err := reentrant.New(cli, "catalog-rebuild")
	if err != nil {
		fmt.Println(err)
		return
	}
	var rebuild func(ctx context.Context, path string, depth int) error
	rebuild = func(ctx context.Context, path string, depth int) (err error) {
		ctx, err = m.Lock(ctx) // ctx now carries the hold
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, m.Unlock(ctx)) }()
		fmt.Printf("%s: held %d deep\n", path, m.Count(ctx))
		if depth == 0 {
			// A fenced write: it applies only while this owner holds the lock.
			_, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("catalog/"+path, "built")).Commit()
			return err
		}
		return rebuild(ctx, path+"/part", depth-1)
	}
	ctx := context.Background()
	if err := rebuild(ctx, "books", 2); err != nil {
		fmt.Println(err)
	}
	fmt.Println("after the last Unlock:", m.Err())
	cli.Delete(ctx, "catalog/", clientv3.WithPrefix()) // leave etcd as the example found it
	// Output:
	// books: held 1 deep
	// books/part: held 2 deep
	// books/part/part: held 3 deep
	// after the last Unlock: etcdsync: not locked
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
