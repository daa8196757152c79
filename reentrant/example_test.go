package reentrant_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. The programs under examples/ run the same uses on an etcd they embed.

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/reentrant"
)

func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	m, err := reentrant.New(cli, "catalog-rebuild")
	if err != nil {
		fmt.Println(err)
		return
	}
	// rebuild locks at every level with the context of the level above: the first Lock
	// takes the lock, the nested ones re-enter it.
	var rebuild func(ctx context.Context, path string, depth int) error
	rebuild = func(ctx context.Context, path string, depth int) (err error) {
		ctx, err = m.Lock(ctx)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, m.Unlock(ctx)) }()
		fmt.Printf("%s: held %d deep\n", path, m.Count(ctx))
		if depth == 0 {
			// A fenced write: it applies only while this owner still holds the lock.
			_, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("catalog/"+path, "built")).Commit()
			return err
		}
		return rebuild(ctx, path+"/part", depth-1)
	}
	if err := rebuild(context.Background(), "books", 2); err != nil {
		fmt.Println(err)
	}
	fmt.Println("after the last Unlock:", m.Err())
	// Prints:
	// books: held 1 deep
	// books/part: held 2 deep
	// books/part/part: held 3 deep
	// after the last Unlock: etcdsync: not locked
}
