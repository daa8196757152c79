package latch_test

// The example needs an etcd at localhost:2379: go test compiles it and does not run it.
// examples/stages runs the same use on an etcd it embeds.

import (
	"context"
	"fmt"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/latch"
)

// A deploy goes on once its 3 canaries have reported healthy: each counts the latch down
// once, by its own name, however often it retries; any number of processes wait.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
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
	// Each canary, once healthy:
	host, _ := os.Hostname()
	if err := l.CountDownAs(ctx, host); err != nil {
		fmt.Println(err)
		return
	}
	// The deploy, and anyone else, waits for zero.
	if err := l.Await(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// The count stays in etcd until deleted: it has no lease.
	if err := l.Delete(ctx); err != nil {
		fmt.Println(err)
	}
}
