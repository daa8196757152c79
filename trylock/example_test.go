package trylock_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. The programs under examples/ run the same uses on an etcd they embed.

import (
	"context"
	"errors"
	"fmt"
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
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
	// Prints:
	// a: running the report
	// b: another instance has the report, skipping
	// b: got the lock after a's run
}
