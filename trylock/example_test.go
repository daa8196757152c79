package trylock_test

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

	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/trylock"
)

// Two instances of a nightly job: the one that gets the lock runs, the other skips its run
// instead of queueing behind it. Then a job that must run waits for the lock, for at most
// a minute.
func Example() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	a, _ := mutex.New(cli, "nightly-report")
	b, _ := mutex.New(cli, "nightly-report")

	runOnce := func(instance string, m *mutex.Mutex) bool {
		err := trylock.Once(ctx, m)
		if errors.Is(err, trylock.ErrLocked) {
			fmt.Println(instance + ": another instance has the report, skipping")
			return false
		}
		if err != nil {
			fmt.Println(instance+":", err)
			return false
		}
		fmt.Println(instance + ": running the report")
		return true
	}
	if runOnce("a", a) {
		runOnce("b", b)
		go a.Unlock(ctx) // a's run is over soon
	}

	// A release on the name wakes the retry: b does not sleep out its backoff.
	if err := trylock.Timeout(ctx, b, time.Minute); err != nil {
		fmt.Println("b:", err) // errors.Is(err, trylock.ErrTimeout) after a minute
		return
	}
	fmt.Println("b: got the lock after a's run")
	_ = b.Unlock(ctx)
	// Output:
	// a: running the report
	// b: another instance has the report, skipping
	// b: got the lock after a's run
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
