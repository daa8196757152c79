package mutex_test

// The examples need an etcd at localhost:2379: go test compiles them and does not run
// them. The programs under examples/ run the same uses on an etcd they embed.

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/mutex"
)

func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	m, err := mutex.New(cli, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := m.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// A fenced write: it applies only while this process still holds the lock.
	resp, err := cli.Txn(ctx).If(m.IsOwner()).
		Then(clientv3.OpPut("reports/last-run", "2026-11-22")).Commit()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("written under the lock:", resp.Succeeded)
	if err := m.Unlock(ctx); err != nil && !errors.Is(err, mutex.ErrLost) {
		fmt.Println(err)
	}
	// Prints: written under the lock: true
}

func ExampleMulti() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()

	// Both accounts, in the transfer's own order: the Multi sorts them, so a transfer the
	// other way round can never deadlock with this one.
	m, err := mutex.NewMulti(cli, []string{"account/paris", "account/berlin"})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = m.Do(ctx, func(ctx context.Context) error {
		// Fenced on every name: it applies only while both are still held.
		resp, err := cli.Txn(ctx).If(m.IsOwner()...).Then(
			clientv3.OpPut("balance/paris", "90"),
			clientv3.OpPut("balance/berlin", "110"),
		).Commit()
		if err == nil {
			fmt.Println(m.Names(), "written under the locks:", resp.Succeeded)
		}
		return err
	})
	if err != nil {
		fmt.Println(err)
	}
	// Prints: [account/berlin account/paris] written under the locks: true
}
