package semaphore_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. The programs under examples/ run the same uses on an etcd they embed.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/semaphore"
)

func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	// At most 2 of these jobs run at once, however many processes run them.
	sem, err := semaphore.New(cli, "thumbnailers", 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	var wg sync.WaitGroup
	var done atomic.Int64
	for range 5 {
		wg.Go(func() {
			p, err := sem.Acquire(ctx)
			if err != nil {
				fmt.Println(err)
				return
			}
			defer p.Release(ctx)
			done.Add(1) // the job; fence its writes with p.IsOwner()
		})
	}
	wg.Wait()
	fmt.Println("jobs done:", done.Load())
	// Prints: jobs done: 5
}

// A training job needs 4 of a pool's 16 GPUs: it takes them in one permit, all or none, so
// that two such jobs never each hold part of what they need.
func ExampleSemaphore_AcquireN() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
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
		return
	}
	fmt.Printf("holding %d of %d; %d in use\n", p.Units(), gpus.Limit(), inUse)
	if err := p.Release(ctx); err != nil { // all 4 at once
		fmt.Println(err)
	}
	// Prints: holding 4 of 16; 4 in use
}
