// Command counter is the classic lock demo done honestly: workers on separate etcd clients
// each add to one counter stored in etcd, every add a read-modify-write under the mutex
// whose write is fenced by the lock (a Txn that applies only while the lock is held). It
// prints the final value beside the expected one, and the lock cycles per second.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/counter
//	go run ./examples/counter -endpoints 127.0.0.1:2379 -workers 16 -adds 100
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/mutex"
)

const (
	lockName   = "etcdsync-example/counter"
	counterKey = "etcdsync-example/counter-value"
)

func main() {
	endpoints := demo.EndpointsFlag()
	workers := flag.Int("workers", 8, "workers, each on its own client")
	adds := flag.Int("adds", 50, "adds per worker")
	flag.Parse()
	if err := run(*endpoints, *workers, *adds); err != nil {
		fmt.Fprintln(os.Stderr, "counter:", err)
		os.Exit(1)
	}
}

func run(endpoints string, workers, adds int) error {
	if workers < 1 || adds < 1 {
		return errors.New("-workers and -adds must be at least 1")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	clients := make([]*clientv3.Client, workers)
	for i := range clients {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		clients[i] = cli
	}
	if _, err := clients[0].Put(ctx, counterKey, "0"); err != nil {
		return fmt.Errorf("reset the counter: %w", err)
	}

	start := time.Now()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i, cli := range clients {
		m, err := mutex.New(cli, lockName)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range adds {
				if errs[i] = addOne(ctx, cli, m); errs[i] != nil {
					cancel() // the others stop too
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	elapsed := time.Since(start)

	resp, err := clients[0].Get(ctx, counterKey)
	if err != nil {
		return fmt.Errorf("read the counter: %w", err)
	}
	got, want := string(resp.Kvs[0].Value), strconv.Itoa(workers*adds)
	fmt.Printf("counter = %s (expected %s) after %d lock cycles by %d workers\n", got, want, workers*adds, workers)
	fmt.Printf("%.0f lock cycles/s\n", float64(workers*adds)/elapsed.Seconds())
	if got != want {
		return errors.New("the counter is wrong")
	}
	return nil
}

// addOne adds one to the counter under m (Mutex.Do). The write is fenced with m.IsOwner():
// should the lock be lost between the read and the write, the write does not apply and the
// add is tried again under a new lock.
func addOne(ctx context.Context, cli *clientv3.Client, m *mutex.Mutex) error {
	for {
		applied := false
		err := m.Do(ctx, func(ctx context.Context) error {
			var err error
			applied, err = fencedIncrement(ctx, cli, m)
			return err
		})
		switch {
		case applied:
			return nil
		case err != nil && !errors.Is(err, mutex.ErrLost):
			return err
		}
	}
}

func fencedIncrement(ctx context.Context, cli *clientv3.Client, m *mutex.Mutex) (bool, error) {
	resp, err := cli.Get(ctx, counterKey)
	if err != nil {
		return false, fmt.Errorf("read: %w", err)
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return false, fmt.Errorf("counter holds %q: %w", resp.Kvs[0].Value, err)
	}
	txn, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(counterKey, strconv.Itoa(n+1))).Commit()
	if err != nil {
		return false, fmt.Errorf("write: %w", err)
	}
	return txn.Succeeded, nil
}
