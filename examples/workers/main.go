// Command workers runs a job queue with bounded concurrency across processes: workers on
// several etcd clients take jobs from one list, and each job runs under a permit of one
// semaphore, so that at most -limit jobs run at once, whichever client runs them. Each job
// records its result with a write fenced by its permit. It prints the peak number of jobs
// running at once (it must reach the limit and never pass it; the exit status says so)
// and the jobs per second.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/workers
//	go run ./examples/workers -endpoints 127.0.0.1:2379 -clients 4 -workers 16 -limit 4 -jobs 200
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
	"github.com/etcdsync/etcdsync/semaphore"
)

const (
	semName   = "etcdsync-example/workers"
	resultDir = "etcdsync-example/workers-results/"
)

func main() {
	endpoints := demo.EndpointsFlag()
	clients := flag.Int("clients", 4, "etcd clients, as if separate processes")
	workers := flag.Int("workers", 16, "workers, spread over the clients")
	limit := flag.Int("limit", 4, "jobs running at once, at most")
	jobs := flag.Int("jobs", 200, "jobs in all")
	work := flag.Duration("work", 5*time.Millisecond, "how long a job works under its permit")
	flag.Parse()
	if err := run(*endpoints, *clients, *workers, *limit, *jobs, *work); err != nil {
		fmt.Fprintln(os.Stderr, "workers:", err)
		os.Exit(1)
	}
}

func run(endpoints string, nClients, nWorkers, limit, jobs int, work time.Duration) error {
	if nClients < 1 || nWorkers < 1 || limit < 1 || jobs < 1 {
		return errors.New("-clients, -workers, -limit and -jobs must be at least 1")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	sems := make([]*semaphore.Semaphore, nClients)
	clis := make([]*clientv3.Client, nClients)
	for i := range sems {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		if sems[i], err = semaphore.New(cli, semName, limit); err != nil {
			return err
		}
		clis[i] = cli
	}
	// A run with another -limit than the last one on this cluster: reset the record, which
	// is safe only while no permit is held (nobody else runs this example now).
	if _, err := clis[0].Delete(ctx, resultDir, clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("clear the results: %w", err)
	}
	if _, err := clis[0].Delete(ctx, semName+"/limit"); err != nil {
		return fmt.Errorf("reset the limit: %w", err)
	}

	queue := make(chan int, jobs)
	for j := range jobs {
		queue <- j
	}
	close(queue)
	var running, peak atomic.Int64
	start := time.Now()
	errs := make([]error, nWorkers)
	var wg sync.WaitGroup
	for w := range nWorkers {
		cli, sem := clis[w%nClients], sems[w%nClients]
		wg.Go(func() {
			for job := range queue {
				if errs[w] = runJob(ctx, cli, sem, job, work, &running, &peak); errs[w] != nil {
					cancel() // the others stop too
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	elapsed := time.Since(start)

	resp, err := clis[0].Get(ctx, resultDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("count the results: %w", err)
	}
	fmt.Printf("%d jobs done (%d results) by %d workers on %d clients, limit %d\n", jobs, resp.Count, nWorkers, nClients, limit)
	fmt.Printf("peak concurrency %d\n", peak.Load())
	fmt.Printf("%.0f jobs/s\n", float64(jobs)/elapsed.Seconds())
	switch {
	case resp.Count != int64(jobs):
		return fmt.Errorf("%d results for %d jobs", resp.Count, jobs)
	case peak.Load() > int64(limit):
		return fmt.Errorf("peak concurrency %d is over the limit %d", peak.Load(), limit)
	case peak.Load() < int64(min(limit, nWorkers, jobs)):
		return fmt.Errorf("peak concurrency %d never reached the limit %d", peak.Load(), limit)
	}
	return nil
}

// runJob runs one job under a permit (Semaphore.Do) and records its result with a write
// fenced by the permit: should the permit be lost meanwhile, the job's ctx ends, the write
// does not apply and the job runs again under a new one.
func runJob(ctx context.Context, cli *clientv3.Client, sem *semaphore.Semaphore, job int, work time.Duration, running, peak *atomic.Int64) error {
	for {
		recorded := false
		err := sem.Do(ctx, 1, func(ctx context.Context) error {
			n := running.Add(1)
			for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
			}
			time.Sleep(work) // the job's work
			running.Add(-1)
			p := sem.PermitOf(ctx)
			resp, err := cli.Txn(ctx).If(p.IsOwner()).
				Then(clientv3.OpPut(resultDir+strconv.Itoa(job), strconv.FormatInt(p.Token(), 10))).Commit()
			if err != nil {
				return fmt.Errorf("job %d: record the result: %w", job, err)
			}
			recorded = resp.Succeeded
			return nil
		})
		switch {
		case recorded:
			return nil
		case err != nil && !errors.Is(err, semaphore.ErrLost):
			return err
		}
	}
}
