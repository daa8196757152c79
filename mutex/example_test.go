package mutex_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/mutex"
)

// One replica at a time writes the nightly report, and its write lands only while it holds
// the lock.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	m, err := mutex.New(cli, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := m.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// A fenced write: etcd applies it only while this hold is alive.
	resp, err := cli.Txn(ctx).If(m.IsOwner()).
		Then(clientv3.OpPut("reports/last-run", "2026-11-22")).Commit()
	if err != nil {
		fmt.Println(err)
	} else {
		fmt.Println("written under the lock:", resp.Succeeded)
	}
	// Unlock deletes the key, fenced; ErrLost if the hold was lost meanwhile.
	if err := m.Unlock(ctx); err != nil {
		fmt.Println(err)
	}
	cli.Delete(ctx, "reports/last-run") // leave etcd as the example found it
	// Output: written under the lock: true
}

// A transfer locks both of its accounts. The Multi sorts the names, so a transfer the
// other way round waits for this one instead of deadlocking with it.
func ExampleMulti() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	m, err := mutex.NewMulti(cli, []string{"account/paris", "account/berlin"})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = m.Do(ctx, func(ctx context.Context) error {
		// Fenced on every name: it applies only while both are held.
		resp, err := cli.Txn(ctx).If(m.IsOwner()...).Then(
			clientv3.OpPut("balance/paris", "90"),
			clientv3.OpPut("balance/berlin", "110"),
		).Commit()
		if err == nil {
			fmt.Println(m.Names(), "written under the locks:", resp.Succeeded)
		}
		return err
	})
	if err != nil {
		fmt.Println(err)
	}
	cli.Delete(ctx, "balance/", clientv3.WithPrefix()) // leave etcd as the example found it
	// Output: [account/berlin account/paris] written under the locks: true
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
