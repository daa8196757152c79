package admin_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run them.

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/admin"
)

// A health check that says who runs the nightly report, and since when.
func ExampleStatus() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()

	snap, err := admin.Status(context.Background(), cli, []string{"nightly-report"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range snap.Names[0].Queue {
		fmt.Printf("%d %s %s token %d owner %s\n", e.Position, e.Kind, e.State, e.Token, e.Owner["host"])
	}
}
