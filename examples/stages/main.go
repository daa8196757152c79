// Command stages runs a batch job in stages across processes: workers on several etcd
// clients first get ready (each counts a latch down once, by its own name), and a
// coordinator waits for the latch to reach zero before it publishes the job; then every
// worker runs the job's stages in lockstep through a double barrier: it enters, runs its
// part of the stage, and leaves, and no worker starts a stage before every worker has
// finished the one before. Each worker records, for each stage, when it started and
// finished its part; the program checks that every part of a stage started after every
// part of the stage before ended (the exit status says so), and prints the rounds the
// barrier went through.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/stages
//	go run ./examples/stages -endpoints 127.0.0.1:2379 -workers 8 -stages 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/latch"
)

const (
	readyName = "etcdsync-example/stages-ready"
	stageName = "etcdsync-example/stages"
	jobKey    = "etcdsync-example/stages-job"
)

func main() {
	endpoints := demo.EndpointsFlag()
	workers := flag.Int("workers", 4, "workers, each on an etcd client of its own, as if separate processes")
	stages := flag.Int("stages", 3, "stages of the job, run in lockstep")
	work := flag.Duration("work", 20*time.Millisecond, "how long a worker's part of a stage takes, at most")
	flag.Parse()
	if err := run(*endpoints, *workers, *stages, *work); err != nil {
		fmt.Fprintln(os.Stderr, "stages:", err)
		os.Exit(1)
	}
}

// part is what a worker recorded of its part of a stage.
type part struct {
	worker, stage int
	round         int64 // the barrier's round it ran in
	start, end    time.Time
}

func run(endpoints string, workers, stages int, work time.Duration) error {
	if workers < 1 || stages < 1 || work <= 0 {
		return errors.New("-workers and -stages must be at least 1, -work above 0")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	coordinator, err := etcd.Client()
	if err != nil {
		return err
	}
	ready, err := latch.New(coordinator, readyName)
	if err != nil {
		return err
	}
	// A latch is set once per name, and stays: the run deletes what an earlier one left.
	if err := ready.Delete(ctx); err != nil {
		return err
	}
	if err := ready.Set(ctx, workers); err != nil {
		return err
	}

	var mu sync.Mutex
	var parts []part
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		wg.Go(func() {
			if errs[w] = worker(ctx, cli, w, workers, stages, work, &mu, &parts); errs[w] != nil {
				cancel() // the others stop too
			}
		})
	}

	// The coordinator publishes the job once every worker is ready.
	if err := ready.Await(ctx); err != nil {
		return fmt.Errorf("await the workers: %w", err)
	}
	if _, err := coordinator.Put(ctx, jobKey, fmt.Sprintf("%d stages", stages)); err != nil {
		return fmt.Errorf("publish the job: %w", err)
	}
	fmt.Printf("%d workers ready; the job published\n", workers)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, _ = coordinator.Delete(ctx, jobKey)
	if err := ready.Delete(ctx); err != nil {
		return err
	}
	return check(parts, workers, stages)
}

// worker gets ready (counts the latch down, by its name), waits for the job, and runs its
// part of each stage between Enter and Leave of the double barrier of every worker.
func worker(ctx context.Context, cli *clientv3.Client, w, workers, stages int, work time.Duration, mu *sync.Mutex, parts *[]part) error {
	ready, err := latch.New(cli, readyName)
	if err != nil {
		return err
	}
	b, err := barrier.New(cli, stageName, workers)
	if err != nil {
		return err
	}
	// Named: a worker that retries after a timeout, or restarts, counts once.
	if err := ready.CountDownAs(ctx, fmt.Sprintf("worker-%d", w)); err != nil {
		return fmt.Errorf("worker %d: ready: %w", w, err)
	}
	if err := awaitJob(ctx, cli); err != nil {
		return fmt.Errorf("worker %d: %w", w, err)
	}
	for s := range stages {
		if err := b.Enter(ctx); err != nil { // once every worker has entered
			return fmt.Errorf("worker %d: stage %d: enter: %w", w, s, err)
		}
		p := part{worker: w, stage: s, round: b.Round(), start: time.Now()}
		time.Sleep(time.Duration(rand.Int64N(int64(work)))) // the worker's part of the stage
		p.end = time.Now()
		mu.Lock()
		*parts = append(*parts, p)
		mu.Unlock()
		if err := b.Leave(ctx); err != nil { // once every worker has left
			return fmt.Errorf("worker %d: stage %d: leave: %w", w, s, err)
		}
	}
	return nil
}

// awaitJob returns once the coordinator has published the job.
func awaitJob(ctx context.Context, cli *clientv3.Client) error {
	resp, err := cli.Get(ctx, jobKey)
	if err != nil {
		return fmt.Errorf("read the job: %w", err)
	}
	if len(resp.Kvs) > 0 {
		return nil
	}
	for wr := range cli.Watch(ctx, jobKey, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch the job: %w", err)
		}
		if len(wr.Events) > 0 {
			return nil
		}
	}
	return fmt.Errorf("watch the job: %w", ctx.Err())
}

// check checks that every part of a stage started after every part of the stage before
// ended, and that each stage ran in one round of the barrier.
func check(parts []part, workers, stages int) error {
	first := make([]time.Time, stages) // the earliest start of each stage
	last := make([]time.Time, stages)  // the latest end
	rounds := make([]map[int64]bool, stages)
	for s := range rounds {
		rounds[s] = map[int64]bool{}
	}
	for _, p := range parts {
		if first[p.stage].IsZero() || p.start.Before(first[p.stage]) {
			first[p.stage] = p.start
		}
		if p.end.After(last[p.stage]) {
			last[p.stage] = p.end
		}
		rounds[p.stage][p.round] = true
	}
	if len(parts) != workers*stages {
		return fmt.Errorf("%d parts recorded for %d workers and %d stages", len(parts), workers, stages)
	}
	for s := range stages {
		if len(rounds[s]) != 1 {
			return fmt.Errorf("stage %d ran in %d rounds of the barrier", s, len(rounds[s]))
		}
		for r := range rounds[s] {
			fmt.Printf("stage %d: %d workers in round %d of the barrier, %v from first start to last end\n", s, workers, r, last[s].Sub(first[s]).Round(time.Millisecond))
		}
		if s > 0 && first[s].Before(last[s-1]) {
			return fmt.Errorf("stage %d started before stage %d ended", s, s-1)
		}
	}
	fmt.Println("every stage began after the one before it ended")
	return nil
}
