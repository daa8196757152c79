package rwmutex_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. The programs under examples/ run the same uses on an etcd they embed.

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/rwmutex"
)

func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
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

	// A writer: alone, and fenced like a mutex holder.
	if err := rw.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	resp, err := cli.Txn(ctx).If(rw.IsOwner()).
		Then(clientv3.OpPut("pricing/eur", "1.08"), clientv3.OpPut("pricing/usd", "1.00")).Commit()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("written under the write lock:", resp.Succeeded)
	if err := rw.Unlock(ctx); err != nil && !errors.Is(err, rwmutex.ErrLost) {
		fmt.Println(err)
	}

	// Readers: many at once. What they read stands only if RUnlock says nil.
	if err := rw.RLock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	cfg, err := cli.Get(ctx, "pricing/", clientv3.WithPrefix())
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := rw.RUnlock(ctx); err != nil {
		fmt.Println("a writer may have come in meanwhile:", err)
		return
	}
	fmt.Println("read under the read lock:", len(cfg.Kvs), "prices")
	// Prints:
	// written under the write lock: true
	// read under the read lock: 2 prices
}
