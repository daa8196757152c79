package semaphore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// benchClients opens n clients whose RPCs are counted.
func benchClients(b *testing.B, n int) ([]*clientv3.Client, []*rpcstat.Counter) {
	clients, counters := make([]*clientv3.Client, n), make([]*rpcstat.Counter, n)
	for i := range clients {
		counters[i] = &rpcstat.Counter{}
		cfg := cluster.ClientConfig()
		cfg.DialOptions = append(cfg.DialOptions, counters[i].DialOptions()...)
		cli, err := cluster.Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cli.Close() })
		clients[i] = cli
	}
	return clients, counters
}

// sumCounts adds up the counts of counters so far.
func sumCounts(counters []*rpcstat.Counter) rpcstat.Counts {
	sum := rpcstat.Counts{}
	for _, c := range counters {
		sum.Add(c.Counts())
	}
	return sum
}

var benchRun atomic.Int64 // keeps names apart between runs of one benchmark

func benchName(kind string) string { return fmt.Sprintf("bench-%s-%d", kind, benchRun.Add(1)) }

// cycle is one acquire+release of a worker.
type cycle func(ctx context.Context) error

// runCycles runs n cycles spread over the workers, as fast as they go, and returns the time.
func runCycles(b *testing.B, workers []cycle, n int) time.Duration {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	start := time.Now()
	for _, w := range workers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := w(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

const (
	contendedWorkers = 64
	contendedClients = 8
	contendedLimit   = 8
)

// BenchmarkContended: 64 workers on 8 clients cycle permits of a semaphore of 8 as fast as
// they can, then the same workers cycle our mutex (one handle each) on the same server; an
// op is one cycle of each. It reports both rates, per-slot-vs-mutex (the semaphore's rate
// per permit over the mutex's rate: 1 when each permit turns over as fast as the lock),
// and the semaphore's RPCs per acquisition by gRPC method.
//
// ceiling-cycles/s is the same workers on a semaphore of 64, where nobody waits: what the
// server does with two Txns per cycle. On a small machine the server, not the queue, bounds
// the contended rate; sem-vs-ceiling says how close to that bound the queue comes.
func BenchmarkContended(b *testing.B) {
	clients, counters := benchClients(b, contendedClients)
	semWorkers := permitWorkers(b, clients, contendedLimit, unit)
	ceilingWorkers := permitWorkers(b, clients, contendedWorkers, unit)
	mutexName := benchName("contended-mutex")
	mutexWorkers := make([]cycle, contendedWorkers)
	for i := range mutexWorkers {
		m, err := mutex.New(clients[i%contendedClients], mutexName)
		if err != nil {
			b.Fatal(err)
		}
		mutexWorkers[i] = func(ctx context.Context) error {
			if err := m.Lock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		}
	}

	b.ResetTimer()
	before := sumCounts(counters)
	semSpent := runCycles(b, semWorkers, b.N)
	semRPCs := sumCounts(counters).Sub(before)
	mutexSpent := runCycles(b, mutexWorkers, b.N)
	ceilingSpent := runCycles(b, ceilingWorkers, b.N)
	b.StopTimer()

	semRate, mutexRate := float64(b.N)/semSpent.Seconds(), float64(b.N)/mutexSpent.Seconds()
	b.ReportMetric(semRate, "sem-cycles/s")
	b.ReportMetric(mutexRate, "mutex-cycles/s")
	b.ReportMetric(semRate/contendedLimit/mutexRate, "per-slot-vs-mutex")
	b.ReportMetric(float64(b.N)/ceilingSpent.Seconds(), "ceiling-cycles/s")
	b.ReportMetric(ceilingSpent.Seconds()/semSpent.Seconds(), "sem-vs-ceiling")
	delete(semRPCs, "LeaseKeepAlive.send")
	for _, m := range semRPCs.Methods() {
		b.ReportMetric(float64(semRPCs[m])/float64(b.N), "sem-"+m+"/acquire")
	}
}

// unit is one unit for every worker; mixed 1 to 4, by worker.
func unit(int) int { return 1 }

func mixed(i int) int { return 1 + i%4 }

// permitWorkers returns contendedWorkers cycles of acquire+release on one fresh semaphore of
// limit, spread over clients, each client's lease granted and the limit recorded; worker i
// takes units(i) at a time.
func permitWorkers(b *testing.B, clients []*clientv3.Client, limit int, units func(int) int) []cycle {
	name := benchName("contended")
	sems := make([]*semaphore.Semaphore, len(clients))
	for i, cli := range clients {
		s, err := semaphore.New(cli, name, limit)
		if err != nil {
			b.Fatal(err)
		}
		sems[i] = s
		p, err := s.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	workers := make([]cycle, contendedWorkers)
	for i := range workers {
		s, n := sems[i%len(sems)], units(i)
		workers[i] = func(ctx context.Context) error {
			p, err := s.AcquireN(ctx, n)
			if err != nil {
				return err
			}
			return p.Release(ctx)
		}
	}
	return workers
}

const weightedLimit = 16

// BenchmarkWeighted: the 64 workers on 8 clients of BenchmarkContended cycle permits of 1 to 4
// units (by worker) of a semaphore of 16, then permits of one unit of another semaphore of 16:
// the same load, one permit per worker at a time. An op is one cycle of each. It reports
// both rates, weighted-vs-unit, and the weighted permits' RPCs per acquisition: the same as
// a unit permit's, since a permit of n units is one key.
func BenchmarkWeighted(b *testing.B) {
	clients, counters := benchClients(b, contendedClients)
	weighted := permitWorkers(b, clients, weightedLimit, mixed)
	units := permitWorkers(b, clients, weightedLimit, unit)

	b.ResetTimer()
	before := sumCounts(counters)
	weightedSpent := runCycles(b, weighted, b.N)
	rpcs := sumCounts(counters).Sub(before)
	unitSpent := runCycles(b, units, b.N)
	b.StopTimer()

	weightedRate, unitRate := float64(b.N)/weightedSpent.Seconds(), float64(b.N)/unitSpent.Seconds()
	b.ReportMetric(weightedRate, "weighted-cycles/s")
	b.ReportMetric(unitRate, "unit-cycles/s")
	b.ReportMetric(weightedRate/unitRate, "weighted-vs-unit")
	delete(rpcs, "LeaseKeepAlive.send")
	for _, m := range rpcs.Methods() {
		b.ReportMetric(float64(rpcs[m])/float64(b.N), "weighted-"+m+"/acquire")
	}
}

const (
	drainLimit   = 10
	drainTimeout = 3 * time.Minute // per drain, so that a lost hand-off fails instead of hanging
)

// BenchmarkDrain: how fast a queue of waiters drains through a semaphore of 10. Ten
// holders take every permit, n waiters (spread over 8 clients) queue behind them, each in
// its own goroutine, then the holders release and each waiter releases as soon as its
// Acquire returns. An op is one whole drain, on a fresh name. handoffs/s counts waiters
// served per second, from the first holder's release to the last waiter served; it must
// not fall as the queue grows (compare waiters=200 with 1000). <Method>/handoff counts
// every RPC of the drain per waiter served, keep-alives left out (see mutex's BenchmarkDrain).
// units=mixed is the same with waiters of 1 to 4 units (by arrival).
func BenchmarkDrain(b *testing.B) {
	for _, units := range []struct {
		name string
		of   func(int) int
	}{{"1", unit}, {"mixed", mixed}} {
		for _, n := range []int{200, 1000} {
			b.Run(fmt.Sprintf("units=%s/waiters=%d", units.name, n), func(b *testing.B) { benchDrain(b, n, units.of) })
		}
	}
}

func benchDrain(b *testing.B, n int, units func(int) int) {
	admin := cluster.Client(b)
	clients, counters := benchClients(b, contendedClients)
	warm := benchName("drain-warm") // grants the leases outside the counts
	for _, cli := range clients {
		s, err := semaphore.New(cli, warm, 1)
		if err != nil {
			b.Fatal(err)
		}
		p, err := s.Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	stop, cancelAll := context.WithCancel(context.Background())
	var waiters sync.WaitGroup
	b.Cleanup(func() { cancelAll(); waiters.Wait() })

	var spent time.Duration
	rpcs := rpcstat.Counts{}
	b.StopTimer()
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithTimeout(stop, drainTimeout)
		name := benchName("drain")
		sems := make([]*semaphore.Semaphore, len(clients))
		for i, cli := range clients {
			s, err := semaphore.New(cli, name, drainLimit)
			if err != nil {
				b.Fatal(err)
			}
			sems[i] = s
		}
		before := sumCounts(counters)
		holders := make([]*semaphore.Permit, drainLimit)
		for i := range holders {
			p, err := sems[i%len(sems)].Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			holders[i] = p
		}
		served := make([]time.Time, n)
		for i := range n {
			s, k := sems[i%len(sems)], units(i)
			waiters.Go(func() {
				p, err := s.AcquireN(ctx, k)
				if err != nil {
					b.Errorf("waiter %d: Acquire: %v", i, err)
					return
				}
				served[i] = time.Now()
				if err := p.Release(ctx); err != nil {
					b.Errorf("waiter %d: Release: %v", i, err)
				}
			})
		}
		etcdtest.AwaitKeys(b, admin, name+"/permit/", int64(n+drainLimit))

		b.StartTimer()
		start := time.Now()
		for _, p := range holders {
			if err := p.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		waiters.Wait()
		b.StopTimer()
		cancel()
		if b.Failed() {
			return
		}
		spent += slices.MaxFunc(served, time.Time.Compare).Sub(start)
		rpcs.Add(sumCounts(counters).Sub(before))
		delete(rpcs, "LeaseKeepAlive.send")
	}
	handoffs := float64(n * b.N)
	b.ReportMetric(handoffs/spent.Seconds(), "handoffs/s")
	for _, m := range rpcs.Methods() {
		b.ReportMetric(float64(rpcs[m])/handoffs, m+"/handoff")
	}
}
