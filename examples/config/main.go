// Command config guards a configuration of two keys with the readers/writer lock: readers
// on several clients read both keys under the read lock, with two Gets, while a writer on a
// client of its own rewrites both under the write lock, in a Txn fenced by the lock, every
// 50 ms. Both keys always carry the same version number, so a reader that saw them differ
// would have read halfway through a write; without the lock, two Gets can straddle the
// writer's Txn. It prints the reads per second and the writes done, and exits non-zero if
// a reader ever saw the keys differ or the writer never got in.
//
// The readers of one client share one *RWMutex, and with it one read key in etcd: only
// the first in and the last out of a group write to etcd.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/config
//	go run ./examples/config -endpoints 127.0.0.1:2379 -clients 8 -readers 16 -duration 30s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/rwmutex"
)

const (
	lockName   = "etcdsync-example/config"
	keyA, keyB = "etcdsync-example/config/a", "etcdsync-example/config/b"
	writeEvery = 50 * time.Millisecond
)

func main() {
	endpoints := demo.EndpointsFlag()
	clients := flag.Int("clients", 4, "reading clients")
	readers := flag.Int("readers", 8, "reading goroutines per client")
	duration := flag.Duration("duration", 5*time.Second, "how long to read")
	flag.Parse()
	if err := run(*endpoints, *clients, *readers, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "config:", err)
		os.Exit(1)
	}
}

func run(endpoints string, clients, readers int, duration time.Duration) error {
	if clients < 1 || readers < 1 || duration <= 0 {
		return errors.New("-clients and -readers must be at least 1, -duration above 0")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), duration+time.Minute)
	defer cancel()
	wcli, err := etcd.Client()
	if err != nil {
		return err
	}
	writer, err := rwmutex.New(wcli, lockName)
	if err != nil {
		return err
	}
	if _, err := writeBoth(ctx, wcli, writer); err != nil { // both keys exist before anyone reads
		return err
	}

	type reader struct {
		cli *clientv3.Client
		rw  *rwmutex.RWMutex
	}
	var readerClients []reader
	for range clients {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		rw, err := rwmutex.New(cli, lockName) // shared by the client's readers
		if err != nil {
			return err
		}
		readerClients = append(readerClients, reader{cli, rw})
	}

	// Everyone works until the deadline; the lock calls run on ctx, so that none is cut
	// off halfway.
	deadline, stop := context.WithTimeout(ctx, duration)
	defer stop()
	start := time.Now()
	var reads, torn atomic.Int64
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		stop() // the others stop too
	}
	var wg sync.WaitGroup
	for _, r := range readerClients {
		for range readers {
			wg.Go(func() {
				for deadline.Err() == nil {
					a, b, err := readBoth(ctx, r.cli, r.rw)
					if err != nil {
						fail(err)
						return
					}
					reads.Add(1)
					if a != b && torn.Add(1) <= 10 {
						fmt.Printf("torn read: %s = %s, %s = %s\n", keyA, a, keyB, b)
					}
				}
			})
		}
	}

	var writes int
	var version string
	wg.Go(func() {
		tick := time.NewTicker(writeEvery)
		defer tick.Stop()
		for {
			select {
			case <-deadline.Done():
				return
			case <-tick.C:
			}
			v, err := writeBoth(ctx, wcli, writer)
			if err != nil {
				fail(err)
				return
			}
			if v != "" {
				writes++
				version = v
			}
		}
	})
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}

	fmt.Printf("%d readers on %d clients, one writer, for %v\n", clients*readers, clients, duration)
	fmt.Printf("reads:  %d (%.0f/s), %d torn\n", reads.Load(), float64(reads.Load())/elapsed.Seconds(), torn.Load())
	fmt.Printf("writes: %d (config at version %s)\n", writes, version)
	switch {
	case torn.Load() > 0:
		return fmt.Errorf("%d reads saw the two keys at different versions", torn.Load())
	case writes == 0:
		return errors.New("the writer never got the write lock")
	}
	return nil
}

// readBoth reads both keys under the read lock, one Get each, and returns their values.
func readBoth(ctx context.Context, cli *clientv3.Client, rw *rwmutex.RWMutex) (a, b string, err error) {
	if err := rw.RLock(ctx); err != nil {
		return "", "", err
	}
	a, err = get(ctx, cli, keyA)
	if err == nil {
		b, err = get(ctx, cli, keyB)
	}
	if uerr := rw.RUnlock(ctx); uerr != nil {
		return "", "", errors.Join(err, uerr) // lost: the read proves nothing
	}
	return a, b, err
}

func get(ctx context.Context, cli *clientv3.Client, key string) (string, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("read %s: no such key", key)
	}
	return string(resp.Kvs[0].Value), nil
}

// writeBoth takes the write lock and sets both keys to the next version in one Txn fenced
// by the lock, so that a writer who lost the lock (a pause past its lease) writes nothing.
// It returns the version written, or "" if the fence stopped the write.
func writeBoth(ctx context.Context, cli *clientv3.Client, rw *rwmutex.RWMutex) (string, error) {
	if err := rw.Lock(ctx); err != nil {
		return "", err
	}
	version, err := nextVersion(ctx, cli)
	var applied bool
	if err == nil {
		var resp *clientv3.TxnResponse
		resp, err = cli.Txn(ctx).If(rw.IsOwner()).
			Then(clientv3.OpPut(keyA, version), clientv3.OpPut(keyB, version)).
			Commit()
		if err != nil {
			err = fmt.Errorf("write: %w", err)
		}
		applied = err == nil && resp.Succeeded
	}
	if uerr := rw.Unlock(ctx); uerr != nil && !errors.Is(uerr, rwmutex.ErrLost) {
		return "", errors.Join(err, uerr)
	}
	if !applied {
		return "", err
	}
	return version, nil
}

// nextVersion is one more than the version of the configuration, 1 if there is none.
func nextVersion(ctx context.Context, cli *clientv3.Client) (string, error) {
	resp, err := cli.Get(ctx, keyA)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", keyA, err)
	}
	if len(resp.Kvs) == 0 {
		return "1", nil
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return "", fmt.Errorf("%s holds %q: %w", keyA, resp.Kvs[0].Value, err)
	}
	return strconv.Itoa(n + 1), nil
}
