package once_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/once"
)

// A nightly report, run by cron on every host: the first host whose cron fires runs it; the
// others, however late in the day, find the day done.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	job, err := once.New(cli, "nightly-report", 24*time.Hour)
	if err != nil {
		fmt.Println(err)
		return
	}
	var day time.Time
	report := func(ctx context.Context) error {
		day = once.Start(ctx) // the day this run is for (UTC): report on the one before it
		return nil
	}
	for _, host := range []string{"host-a", "host-b"} {
		ran, err := job.Run(ctx, report)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s ran the report: %v\n", host, ran)
	}
	last, err := job.Last(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("recorded for the day it ran for:", last.Start.Equal(day))
	// The record has no lease: it stays until deleted, and the next Run then runs.
	if err := job.Delete(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// host-a ran the report: true
	// host-b ran the report: false
	// recorded for the day it ran for: true
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
