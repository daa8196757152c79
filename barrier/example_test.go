package barrier_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. examples/stages runs the same use on an etcd it embeds.

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/barrier"
)

// Each of 8 workers, in any processes, runs a stage of a job only once all 8 are there,
// and goes on to the next stage only once all 8 are done with this one.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	b, err := barrier.New(cli, "nightly-shards", 8)
	if err != nil {
		fmt.Println(err)
		return
	}
	for stage := range 3 {
		if err := b.Enter(ctx); err != nil { // once 8 have entered
			fmt.Println(err)
			return
		}
		err := runStage(ctx, stage)
		// Leave in any case: the others wait for every participant of the round.
		if err := errors.Join(err, b.Leave(ctx)); err != nil {
			fmt.Println(err)
			return
		}
	}
}

// A gate: workers wait until a coordinator releases them.
func ExampleGate() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	g, err := barrier.NewGate(cli, "schema-migrated")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The coordinator holds the gate before any worker starts, migrates, then releases.
	if err := g.Hold(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// ... elsewhere, every worker: g.Wait(ctx), which returns at once if released already.
	if err := g.Release(ctx); err != nil {
		fmt.Println(err)
	}
}

func runStage(context.Context, int) error { return nil }
