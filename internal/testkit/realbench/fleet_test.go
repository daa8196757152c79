package realbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// fleetSizes are the waiting clients of BenchmarkFleetDrain's sub-benchmarks; more come
// from ETCDSYNC_BENCH_FLEET (see fleetExtra).
var fleetSizes = []int{8, 32, 128}

// BenchmarkFleetDrain: a fleet waiting once on one name (issue 37). N clients, one each as N
// replicas would have, each queue one waiter on one mutex behind a holder on a client of its
// own; then the holder unlocks and the queue drains, each waiter locking once and unlocking
// at once, in queue order. An op is a hand-off: a waiter getting the lock, N of them a
// drain. The rival is etcd's concurrency.Mutex doing the same, one session per client.
//
// Only the drain is measured: its length runs from the holder's Unlock to the last waiter's
// Unlock, and its RPCs and the servers' CPU are read around it. The holder's Lock, the
// waiters' queueing (until all N+1 keys are under the name's prefix in etcd) and the quiet
// after it (until no client has sent or heard anything for a while) come before, outside
// the round: a round is as many whole drains, each queued anew, as it takes for the drains
// to add up to the round's length (see side.prepare).
//
// 8, 32 and 128 clients by default; ETCDSYNC_BENCH_FLEET=1000 (a comma-separated list)
// adds more. With 1,000 clients in one test process the clients share its CPU, which then
// bounds the rates: read the servers' CPU per hand-off (etcdCPU-ms/handoff,
// leaderCPU-ms/handoff) and the Watch.events per hand-off, not the rates.
func BenchmarkFleetDrain(b *testing.B) {
	sizes := slices.Concat(fleetSizes, fleetExtra(b))
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchFleet(b, t, n) })
		}
	})
}

// BenchmarkFleetDrainSemaphore is BenchmarkFleetDrain for a semaphore of capacity
// fleetCapacity: the holder takes every unit, each waiter one; a release of the holder
// admits fleetCapacity waiters, and each of their releases the next. An op is a waiter's
// admission. The rival is ours' mutex draining the same fleet: there is no semaphore of
// etcd's own to set beside it, and the build before and after a change, run in turn, is
// the comparison that tells.
func BenchmarkFleetDrainSemaphore(b *testing.B) {
	sizes := slices.Concat(fleetSizes, fleetExtra(b))
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchFleetSemaphore(b, t, n) })
		}
	})
}

// BenchmarkFleetDrainElection is BenchmarkFleetDrain for an election: the holder leads,
// each waiter campaigns once, leads, and resigns at once. The rival is etcd's
// concurrency.Election doing the same, one session per client.
func BenchmarkFleetDrainElection(b *testing.B) {
	sizes := slices.Concat(fleetSizes, fleetExtra(b))
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchFleetElection(b, t, n) })
		}
	})
}

// BenchmarkFleetDrainRWMutex is BenchmarkFleetDrain for a readers/writer lock: the holder
// writes, and of the waiters every other one writes and the others read, queued in the
// order their Txns land; a reader is served beside the readers next to it. The rival is
// etcd's recipe.RWMutex doing the same, one session per client.
func BenchmarkFleetDrainRWMutex(b *testing.B) {
	sizes := slices.Concat(fleetSizes, fleetExtra(b))
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchFleetRWMutex(b, t, n) })
		}
	})
}

const fleetRWName = "fleet-rw" // ours'; etcd's prefix is root+"etcd-"+fleetRWName

func benchFleetRWMutex(b *testing.B, t *target, n int) {
	side := func(i int, l rwLocker) exclusive {
		if i%2 == 0 {
			return l // the holder, and every other waiter: a writer
		}
		return reading{l}
	}
	fleetVsEtcd(b, t, n, fleetRWName,
		func(i int, cli *clientv3.Client, prefix string) (exclusive, error) {
			rw, err := rwmutex.New(cli, fleetRWName, rwmutex.WithPrefix(prefix))
			return side(i, rw), err
		},
		func(i int, s *concurrency.Session, name string) exclusive {
			return side(i, recipeRW{recipe.NewRWMutex(s, name)})
		})
}

// reading is the read side of an rwLocker as an exclusive: Lock reads, Unlock leaves.
type reading struct{ l rwLocker }

func (r reading) Lock(ctx context.Context) error   { return r.l.RLock(ctx) }
func (r reading) Unlock(ctx context.Context) error { return r.l.RUnlock(ctx) }

const fleetElectName = "fleet-elect" // ours' election; etcd's prefix is root+"etcd-"+fleetElectName

func benchFleetElection(b *testing.B, t *target, n int) {
	fleetVsEtcd(b, t, n, fleetElectName,
		func(_ int, cli *clientv3.Client, prefix string) (exclusive, error) {
			e, err := election.New(cli, fleetElectName, election.WithPrefix(prefix))
			return candidacy{e}, err
		},
		func(_ int, s *concurrency.Session, name string) exclusive {
			return candidacy{concurrency.NewElection(s, name)}
		})
}

// candidacy is a candidate as an exclusive: Lock campaigns, Unlock resigns.
type candidacy struct{ c candidate }

func (c candidacy) Lock(ctx context.Context) error   { return c.c.Campaign(ctx, "v") }
func (c candidacy) Unlock(ctx context.Context) error { return c.c.Resign(ctx) }

const (
	fleetSemName  = "fleet-sem" // the semaphore's name; its rival's is fleetSemName+"-mutex"
	fleetCapacity = 4           // the semaphore's capacity
)

func benchFleetSemaphore(b *testing.B, t *target, n int) {
	ctx := context.Background()
	ours := t.oursClients(b, n+1) // the holder's first
	sems := make([]exclusive, n+1)
	for i, cli := range ours {
		s, err := semaphore.New(cli.Client, fleetSemName, fleetCapacity, semaphore.WithPrefix(t.root))
		must(b, err)
		units := 1
		if i == 0 {
			units = fleetCapacity
		}
		sems[i] = &permitLock{s: s, units: units}
	}
	rivals := t.oursClients(b, n+1)
	mutexes := make([]exclusive, n+1)
	for i, cli := range rivals {
		m, err := mutex.New(cli.Client, fleetSemName+"-mutex", mutex.WithPrefix(t.root))
		must(b, err)
		mutexes[i] = m
	}
	warmLocks(b, ctx, sems, mutexes)
	semSide := drainSide("ours", ours, sems, t.root+core.NamePrefix(fleetSemName)+core.KindPermit)
	mutexSide := drainSide("mutex", rivals, mutexes, t.root+core.NamePrefix(fleetSemName+"-mutex"))
	b.Cleanup(func() { semSide.stop(); mutexSide.stop() })
	reportScrape := scrapeCost(b, t)
	t.measure(b, comparison{
		ours:    semSide.side,
		rival:   mutexSide.side,
		commits: t.commitSides(b),
		slack:   time.Duration(n) * time.Second,
	})
	reportScrape()
}

// permitLock is a semaphore's acquisition of units as an exclusive: Lock acquires them,
// Unlock releases the permit. One goroutine at a time.
type permitLock struct {
	s     *semaphore.Semaphore
	units int
	p     *semaphore.Permit
}

func (l *permitLock) Lock(ctx context.Context) error {
	p, err := l.s.AcquireN(ctx, l.units)
	l.p = p
	return err
}

func (l *permitLock) Unlock(ctx context.Context) error { return l.p.Release(ctx) }

// fleetExtra are the client counts ETCDSYNC_BENCH_FLEET asks for beside fleetSizes.
func fleetExtra(b *testing.B) []int {
	env := os.Getenv("ETCDSYNC_BENCH_FLEET")
	if env == "" {
		return nil
	}
	var out []int
	for _, f := range strings.Split(env, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("ETCDSYNC_BENCH_FLEET=%q: want client counts such as 1000", env)
		}
		out = append(out, n)
	}
	return out
}

const fleetName = "fleet" // ours' mutex name; etcd's prefix is root+"etcd-fleet"

func benchFleet(b *testing.B, t *target, n int) {
	fleetVsEtcd(b, t, n, fleetName,
		func(_ int, cli *clientv3.Client, prefix string) (exclusive, error) {
			return mutex.New(cli, fleetName, mutex.WithPrefix(prefix))
		},
		func(_ int, s *concurrency.Session, name string) exclusive { return concurrency.NewMutex(s, name) })
}

// fleetVsEtcd is the drain of a fleet of n waiters on the name, ours beside etcd's own
// doing the same under root+"etcd-"+name: ours and theirs make the lock of client i (0 the
// holder's, on member 0; then the waiters'), ours with the prefix to give WithPrefix.
func fleetVsEtcd(b *testing.B, t *target, n int, name string,
	ours func(i int, cli *clientv3.Client, prefix string) (exclusive, error),
	theirs func(i int, s *concurrency.Session, name string) exclusive) {
	ctx := context.Background()
	oursClients := t.oursClients(b, n+1)
	oursLocks := make([]exclusive, n+1)
	for i, cli := range oursClients {
		l, err := ours(i, cli.Client, t.root)
		must(b, err)
		oursLocks[i] = l
	}
	etcd, sessions := t.etcdClients(b, n+1)
	etcdLocks := make([]exclusive, n+1)
	for i, s := range sessions {
		etcdLocks[i] = theirs(i, s, t.root+"etcd-"+name)
	}
	warmLocks(b, ctx, oursLocks, etcdLocks) // grants our leases before the rounds
	oursSide := drainSide("ours", oursClients, oursLocks, t.root+core.NamePrefix(name))
	etcdSide := drainSide("etcd", etcd, etcdLocks, t.root+"etcd-"+name+"/")
	b.Cleanup(func() { oursSide.stop(); etcdSide.stop() }) // waiters left by a failed round
	// Measured before the rounds, reported after them: measure's ResetTimer drops metrics.
	reportScrape := scrapeCost(b, t)
	t.measure(b, comparison{
		ours:    oursSide.side,
		rival:   etcdSide.side,
		commits: t.commitSides(b),
		slack:   time.Duration(n) * time.Second, // a drain of 1,000 may take minutes
	})
	reportScrape()
}

// warmLocks locks and unlocks each lock of each set once, one after another.
func warmLocks(b *testing.B, ctx context.Context, sets ...[]exclusive) {
	for _, ls := range sets {
		for _, l := range ls {
			must(b, exclusiveCycle(l, nil)(ctx))
		}
	}
}

// A drain is one side of BenchmarkFleetDrain: locks[0] holds the name, each other lock (on
// a client of its own) waits once behind it; keys is the prefix their keys are under.
type drain struct {
	side
	clients []counted
	locks   []exclusive
	keys    string

	cancel context.CancelFunc // of the waiters queued by prepare; nil when none are
	done   chan error         // each waiter's end: nil once it locked and unlocked
}

const (
	fleetQuiet    = 50 * time.Millisecond // no call under way, none sent, no event heard this long: settled
	fleetQueueFor = 2 * time.Minute       // the longest prepare waits for the waiters' keys
)

func drainSide(name string, clients []counted, locks []exclusive, keys string) *drain {
	d := &drain{clients: clients, locks: locks, keys: keys}
	d.side = side{name: name, prepare: d.queue, run: d.drain}
	return d
}

// queue takes the lock with the holder, queues every waiter behind it and returns once etcd
// holds all their keys and the clients have settled.
func (d *drain) queue(ctx context.Context) error {
	holder, waiters := d.locks[0], d.locks[1:]
	if err := holder.Lock(ctx); err != nil {
		return fmt.Errorf("holder: Lock: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	d.cancel, d.done = cancel, make(chan error, len(waiters))
	for i, w := range waiters {
		go func() {
			err := w.Lock(wctx)
			if err == nil {
				err = w.Unlock(ctx)
			}
			if err != nil {
				err = fmt.Errorf("waiter %d: %w", i+1, err)
			}
			d.done <- err
		}()
	}
	if err := d.awaitKeys(ctx, int64(len(d.locks))); err != nil {
		d.stop()
		return err
	}
	return d.awaitQuiet(ctx)
}

// awaitKeys polls etcd until the name holds want keys: the holder's and every waiter's.
func (d *drain) awaitKeys(ctx context.Context, want int64) error {
	ctx, cancel := context.WithTimeout(ctx, fleetQueueFor)
	defer cancel()
	cli := d.clients[0]
	for {
		resp, err := cli.Get(ctx, d.keys, clientv3.WithPrefix(), clientv3.WithCountOnly())
		switch {
		case err != nil:
			return fmt.Errorf("count the keys under %q: %w", d.keys, err)
		case resp.Count == want:
			return nil
		case resp.Count > want:
			return fmt.Errorf("%q holds %d keys, more than the holder's and the %d waiters'", d.keys, resp.Count, want-1)
		}
		select {
		case err := <-d.done: // a waiter ended before the holder let go
			if err == nil {
				err = errors.New("a waiter got the lock while the holder held it")
			}
			d.done <- err // stop counts every waiter
			return err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// awaitQuiet waits until no client has had a unary call under way, sent anything
// (keep-alives aside) nor heard a watch event for fleetQuiet: the queueing's reads, watch
// creates and watch events are over. (Without the calls under way, 1,000 waiters whose
// reads etcd had not yet answered looked quiet, and created their watches in the drain.)
func (d *drain) awaitQuiet(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, fleetQueueFor)
	defer cancel()
	total := func() int64 {
		c := countsOf(d.clients)
		delete(c, keepAlives)
		var sum int64
		for _, v := range c {
			sum += v
		}
		return sum
	}
	last, since := total(), time.Now()
	for time.Since(since) < fleetQuiet {
		select {
		case <-ctx.Done():
			d.stop()
			return fmt.Errorf("the clients never settled after queueing: %w", ctx.Err())
		case <-time.After(fleetQuiet / 5):
		}
		busy := false
		for _, c := range d.clients {
			busy = busy || c.pending.Load() > 0
		}
		if now := total(); now != last || busy {
			last, since = now, time.Now()
		}
	}
	return nil
}

// drain lets the holder go and waits for every waiter to have locked and unlocked.
func (d *drain) drain(ctx context.Context, _ time.Duration) (tally, error) {
	n := int64(len(d.locks) - 1)
	before := countsOf(d.clients)
	start := time.Now()
	err := d.locks[0].Unlock(ctx)
	if err != nil {
		err = fmt.Errorf("holder: Unlock: %w", err)
		d.cancel()
	}
	err = errors.Join(err, d.wait())
	elapsed := time.Since(start)
	return tally{elapsed, []count{{"handoff", n, n, countsOf(d.clients).Sub(before)}}, nil}, err
}

// wait waits for every waiter queue started and returns their errors.
func (d *drain) wait() error {
	if d.cancel == nil {
		return nil
	}
	var errs []error
	for range len(d.locks) - 1 {
		if err := <-d.done; err != nil {
			errs = append(errs, err)
		}
	}
	d.cancel()
	d.cancel, d.done = nil, nil
	return errors.Join(errs...)
}

// stop ends the waiters queue started, if any are left: after a failure.
func (d *drain) stop() {
	if d.cancel != nil {
		d.cancel()
		_ = d.wait()
	}
}

// scrapeObservations is how many empty runs scrapeCost observes.
const scrapeObservations = 50

// scrapeCost measures what observing one run costs the servers within the run's
// figures: the /metrics reads around it, which etcd serves with some ms of CPU each, part of
// it after it read its CPU counter for the first and part before for the second. A loop's
// round pays it once for thousands of ops; a drain pays it once for its N hand-offs, so
// at 8 clients it is a fair part of the CPU per hand-off. Measured as the mean of empty
// runs observed as the sides' are: "scrape-etcdCPU-ms/observation" over every member and
// "scrape-leaderCPU-ms/observation" on the leader. Subtract it divided by N from a side's
// etcdCPU-ms/handoff (leaderCPU-ms/handoff) for the drain's own. It returns what reports
// the figures.
func scrapeCost(b *testing.B, t *target) (report func()) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := t.metrics.sample(ctx); err != nil {
		b.Logf("scrape cost not measured: no server metrics: %v", err)
		return func() {}
	}
	empty := observed(side{name: "empty", run: func(context.Context, time.Duration) (tally, error) {
		return tally{counts: []count{{op: "observation"}}}, nil
	}}, t.metrics, t.leader, nil)
	var members, leader float64
	for range scrapeObservations {
		got, err := empty.run(ctx, 0)
		if err == nil && got.use.err != nil {
			err = got.use.err
		}
		if err != nil {
			b.Logf("scrape cost not measured: %v", err)
			return func() {}
		}
		members += got.use.members[cpuSeconds]
		leader += got.use.leader[cpuSeconds]
	}
	members, leader = members*1000/scrapeObservations, leader*1000/scrapeObservations
	b.Logf("observing a run costs the servers %.3g ms of CPU within it (leader %.3g), mean of %d empty runs", members, leader, scrapeObservations)
	return func() {
		b.ReportMetric(members, "scrape-etcdCPU-ms/observation")
		b.ReportMetric(leader, "scrape-leaderCPU-ms/observation")
	}
}
