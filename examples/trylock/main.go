// Command trylock shows jobs that must not run twice at once and must not queue either.
//
// First, a cron-style job: at every tick, several instances (each on its own etcd client, as
// on separate machines) fire at once; the one that gets the lock runs, the others skip the
// tick at once (trylock.Once) instead of queueing to run it again. Then a job that must run
// but may wait a little: one instance holds the lock for a while, another waits for it with
// trylock.Timeout and is woken by the release, and a third gives up after a few tries
// (trylock.Retry with Attempts). It prints what each instance did.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/trylock
//	go run ./examples/trylock -endpoints 127.0.0.1:2379 -instances 5 -ticks 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/trylock"
)

const (
	cronLock   = "etcdsync-example/trylock-cron"
	lastRunKey = "etcdsync-example/trylock-last-run"
	mustLock   = "etcdsync-example/trylock-compaction"
)

func main() {
	endpoints := demo.EndpointsFlag()
	instances := flag.Int("instances", 3, "instances of the cron job, each on its own client")
	ticks := flag.Int("ticks", 3, "ticks of the cron job")
	flag.Parse()
	if err := run(*endpoints, *instances, *ticks); err != nil {
		fmt.Fprintln(os.Stderr, "trylock:", err)
		os.Exit(1)
	}
}

func run(endpoints string, instances, ticks int) error {
	if instances < 3 || ticks < 1 {
		return errors.New("-instances must be at least 3 and -ticks at least 1")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	clients := make([]*clientv3.Client, instances)
	for i := range clients {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		clients[i] = cli
	}
	if err := cron(ctx, clients, ticks); err != nil {
		return err
	}
	return mustRun(ctx, clients[:3])
}

// cron fires every instance at each tick; each runs the job only if it gets the lock.
func cron(ctx context.Context, clients []*clientv3.Client, ticks int) error {
	fmt.Printf("cron job: %d instances, %d ticks\n", len(clients), ticks)
	for tick := 1; tick <= ticks; tick++ {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			ran  []string
			errs []error
		)
		for i, cli := range clients {
			wg.Go(func() {
				name := fmt.Sprintf("instance %d", i+1)
				did, err := cronTick(ctx, cli, name, tick)
				mu.Lock()
				defer mu.Unlock()
				if did {
					ran = append(ran, name)
				}
				errs = append(errs, err)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		fmt.Printf("  tick %d: %d of %d instances ran the job (%s), the others skipped it\n", tick, len(ran), len(clients), strings.Join(ran, ", "))
		if len(ran) > 1 {
			return errors.New("the job ran twice in one tick")
		}
	}
	return nil
}

// cronTick is one instance's turn at one tick: it runs the job under the lock, or skips.
func cronTick(ctx context.Context, cli *clientv3.Client, instance string, tick int) (bool, error) {
	m, err := mutex.New(cli, cronLock)
	if err != nil {
		return false, err
	}
	switch err := trylock.Once(ctx, m); {
	case errors.Is(err, trylock.ErrLocked):
		return false, nil // another instance runs this tick: nothing written, nothing to undo
	case err != nil:
		return false, err
	}
	defer m.Unlock(context.Background())
	// The job: long enough that every instance's try of this tick finds it running. Its
	// write is fenced, so it applies only while this instance still holds the lock.
	time.Sleep(200 * time.Millisecond)
	resp, err := cli.Txn(ctx).If(m.IsOwner()).
		Then(clientv3.OpPut(lastRunKey, fmt.Sprintf("tick %d by %s", tick, instance))).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// mustRun: instance 1 holds the lock for a second; instance 2 waits up to 5 s for it with
// Timeout; instance 3 tries three times with Retry (backoff from 100 ms), then gives up.
func mustRun(ctx context.Context, clients []*clientv3.Client) error {
	fmt.Println("job that must run, waiting a little:")
	var ms [3]*mutex.Mutex
	for i, cli := range clients {
		m, err := mutex.New(cli, mustLock)
		if err != nil {
			return err
		}
		ms[i] = m
	}
	if err := ms[0].Lock(ctx); err != nil {
		return err
	}
	start := time.Now()
	fmt.Println("  instance 1: runs for 1s")
	go func() {
		time.Sleep(time.Second)
		_ = ms[0].Unlock(context.Background())
	}()

	var wg sync.WaitGroup
	var timeoutErr, retryErr error
	wg.Go(func() {
		timeoutErr = trylock.Timeout(ctx, ms[1], 5*time.Second)
		if timeoutErr == nil {
			fmt.Printf("  instance 2: Timeout(5s) got the lock after %v, woken by instance 1's release\n", time.Since(start).Round(10*time.Millisecond))
			defer ms[1].Unlock(context.Background())
			time.Sleep(500 * time.Millisecond) // its run
		}
	})
	wg.Go(func() {
		retryErr = trylock.Retry(ctx, ms[2], trylock.Attempts(3), trylock.Backoff(100*time.Millisecond, 400*time.Millisecond))
		switch {
		case errors.Is(retryErr, trylock.ErrLocked):
			fmt.Printf("  instance 3: Retry(Attempts(3)) gave up after %v: %v\n", time.Since(start).Round(10*time.Millisecond), retryErr)
			retryErr = nil
		case retryErr == nil:
			fmt.Println("  instance 3: Retry(Attempts(3)) got the lock")
			_ = ms[2].Unlock(context.Background())
		}
	})
	wg.Wait()
	return errors.Join(timeoutErr, retryErr)
}
