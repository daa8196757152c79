// Command recursive shows the reentrant lock in the job it is made for: a job that walks a
// tree recursively and locks at every level with the context it got from the level above.
// The first Lock of a job takes the lock; every nested one re-enters it at once, with no
// round trip to etcd, and the job's last Unlock releases it. Jobs on separate etcd clients
// take turns: the program checks that no two are ever inside at once, in this process and
// with a write fenced by the lock at every node, and fails loudly otherwise. It prints each
// job's walk with the lock's hold count at every level, and a summary.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/recursive
//	go run ./examples/recursive -endpoints 127.0.0.1:2379 -jobs 8 -depth 5 -fanout 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/reentrant"
)

const (
	lockName   = "etcdsync-example-recursive" // no '/': its keys are "<name>/<lease>_<n>"
	counterKey = "etcdsync-example/recursive-visits"
)

func main() {
	endpoints := demo.EndpointsFlag()
	jobs := flag.Int("jobs", 4, "jobs, each on its own client")
	depth := flag.Int("depth", 4, "levels of the tree each job walks")
	fanout := flag.Int("fanout", 2, "children of every node above the last level")
	flag.Parse()
	if err := run(*endpoints, *jobs, *depth, *fanout); err != nil {
		fmt.Fprintln(os.Stderr, "recursive:", err)
		os.Exit(1)
	}
}

func run(endpoints string, jobs, depth, fanout int) error {
	if jobs < 1 || depth < 1 || fanout < 1 {
		return errors.New("-jobs, -depth and -fanout must be at least 1")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	walkers := make([]*walker, jobs)
	for i := range walkers {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		m, err := reentrant.New(cli, lockName)
		if err != nil {
			return err
		}
		walkers[i] = &walker{job: i + 1, cli: cli, m: m, depth: depth, fanout: fanout}
	}
	if _, err := walkers[0].cli.Put(ctx, counterKey, "0"); err != nil {
		return fmt.Errorf("reset the counter: %w", err)
	}

	start := time.Now()
	var in inside
	errs := make([]error, jobs)
	var wg sync.WaitGroup
	for i, w := range walkers {
		wg.Go(func() {
			if errs[i] = w.run(ctx, &in); errs[i] != nil {
				cancel() // the others stop too
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	elapsed := time.Since(start)

	resp, err := walkers[0].cli.Get(ctx, counterKey)
	if err != nil {
		return fmt.Errorf("read the counter: %w", err)
	}
	nodes := 0
	for level, width := 1, 1; level <= depth; level, width = level+1, width*fanout {
		nodes += width
	}
	got, want := string(resp.Kvs[0].Value), strconv.Itoa(jobs*nodes)
	fmt.Printf("%d jobs walked %d nodes each, %d levels deep, in %v: %d Locks, of which %d re-entered\n",
		jobs, nodes, depth, elapsed.Round(time.Millisecond), jobs*nodes, jobs*(nodes-1))
	fmt.Printf("fenced visits counted in etcd = %s (expected %s); at most %d job inside at once\n", got, want, in.most.Load())
	if got != want || in.most.Load() != 1 {
		return errors.New("two jobs were inside at once")
	}
	return nil
}

// inside counts the jobs inside the lock, in this process.
type inside struct{ now, most atomic.Int64 }

func (in *inside) enter() {
	n := in.now.Add(1)
	for {
		most := in.most.Load()
		if n <= most || in.most.CompareAndSwap(most, n) {
			return
		}
	}
}

func (in *inside) leave() { in.now.Add(-1) }

// walker is one job: it walks a tree of depth levels, fanout children per node.
type walker struct {
	job           int
	cli           *clientv3.Client
	m             *reentrant.Mutex
	depth, fanout int
}

// run walks the tree from a context that owns nothing: the job is a new owner, and its
// first Lock waits its turn.
func (w *walker) run(ctx context.Context, in *inside) error { return w.visit(ctx, in, "0", 1) }

// visit locks at this node with the context of the level above, records a fenced visit and
// walks the children. At level 1 the Lock takes the lock; below, ctx carries the job's
// ownership and the Lock re-enters at once.
func (w *walker) visit(ctx context.Context, in *inside, node string, level int) (err error) {
	ctx, err = w.m.Lock(ctx)
	if err != nil {
		return fmt.Errorf("job %d node %s: %w", w.job, node, err)
	}
	defer func() {
		if uerr := w.m.Unlock(ctx); uerr != nil {
			err = errors.Join(err, fmt.Errorf("job %d node %s: %w", w.job, node, uerr))
		}
	}()
	if level == 1 {
		if err := w.enter(ctx, in); err != nil {
			return err
		}
		defer in.leave() // before the last Unlock lets the next job in
	}
	fmt.Printf("%sjob %d node %s: level %d, hold count %d\n", strings.Repeat("  ", level), w.job, node, level, w.m.Count(ctx))
	if err := w.countVisit(ctx); err != nil {
		return fmt.Errorf("job %d node %s: %w", w.job, node, err)
	}
	if level == w.depth {
		return nil
	}
	for i := range w.fanout {
		if err := w.visit(ctx, in, node+"."+strconv.Itoa(i), level+1); err != nil {
			return err
		}
	}
	return nil
}

// enter counts the job in and prints whom etcd says holds the lock: the key's value.
func (w *walker) enter(ctx context.Context, in *inside) error {
	in.enter()
	if n := in.now.Load(); n != 1 {
		return fmt.Errorf("job %d: %d jobs inside at once", w.job, n)
	}
	holder, err := w.cli.Get(ctx, lockName+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return fmt.Errorf("job %d: read the holder: %w", w.job, err)
	}
	fmt.Printf("job %d holds the lock (token %d), its key says %q\n", w.job, w.m.Token(), holder.Kvs[0].Value)
	return nil
}

// countVisit adds one to the counter in etcd, a read-modify-write whose write applies only
// while the job holds the lock: were two jobs inside at once, their adds would be lost or
// refused.
func (w *walker) countVisit(ctx context.Context) error {
	resp, err := w.cli.Get(ctx, counterKey)
	if err != nil {
		return fmt.Errorf("read the counter: %w", err)
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return fmt.Errorf("the counter holds %q: %w", resp.Kvs[0].Value, err)
	}
	txn, err := w.cli.Txn(ctx).
		If(w.m.IsOwner(), clientv3.Compare(clientv3.ModRevision(counterKey), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpPut(counterKey, strconv.Itoa(n+1))).Commit()
	if err != nil {
		return fmt.Errorf("write the counter: %w", err)
	}
	if !txn.Succeeded {
		return errors.New("the fenced write was refused: the lock was lost, or another job wrote meanwhile")
	}
	return nil
}
