package election_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. The programs under examples/ run the same uses on an etcd they embed.

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
)

func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	e, err := election.New(cli, "billing-leader")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := e.Campaign(ctx, "replica-1"); err != nil { // waits until this replica leads
		fmt.Println(err)
		return
	}
	// Fenced work: it applies only while this replica leads.
	resp, err := cli.Txn(ctx).If(e.IsOwner()).
		Then(clientv3.OpPut("billing/last-run", "2026-11-24")).Commit()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("written as leader:", resp.Succeeded)
	l, err := e.Leader(ctx) // what every replica, and Observe, sees
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("leader:", l.Value)
	if err := e.Resign(ctx); err != nil {
		fmt.Println(err)
	}
	// Prints:
	// written as leader: true
	// leader: replica-1
}

// A rolling upgrade: the new version's replicas campaign with a higher preference, and the
// old leader's Run hands its leadership to one of them once it has waited the settle time.
// An operator can also move it by hand (RequestTransfer, or etcdsync transfer).
func ExampleWithPreference() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	const version = 2 // the old replicas run with 1
	e, err := election.New(cli, "billing-leader", election.WithPreference(version))
	if err != nil {
		fmt.Println(err)
		return
	}
	err = e.Run(ctx, "replica-7 v2", func(ctx context.Context) error {
		fmt.Println("leading")
		<-ctx.Done() // a loss, a transfer to a candidate preferred over v2, or ctx's end
		return nil
	})
	fmt.Println(err)
}
