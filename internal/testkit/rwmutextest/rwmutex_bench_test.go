package rwmutex_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// Every benchmark runs ours ("etcdsync") and etcd's recipe.RWMutex ("etcd") on the same
// embedded server in the same run, one sub-benchmark each; ours vs etcd is the ratio of
// their rates, for the reader to take. An op is a window of time (measureWindow) during
// which the lockers run flat out, so ns/op says nothing: the results are the rates per
// second of acquisitions completed within the windows, and the RPCs per acquisition by
// gRPC method (a "Watch" is a watch stream opened, "Watch.send" a watch created or
// cancelled on one). A fixed time rather than a fixed count of acquisitions keeps the
// writer of the read benchmarks, which comes every 50 ms, in every measurement, however
// fast the readers are. Each benchmark fails if a reader ever was inside beside a
// writer, or a writer beside another.

const (
	measureWindow = 200 * time.Millisecond // the time of one op
	benchTimeout  = 2 * time.Minute        // per benchmark run: a lost wake-up of ours fails instead of hanging
	writeEvery    = 50 * time.Millisecond  // the writer's cadence in the read benchmarks
	// writeHold is how long a writer stays inside in the read benchmarks: a reader let in
	// beside it would find it there.
	writeHold = time.Millisecond
)

type rwLocker interface {
	RLock(context.Context) error
	RUnlock(context.Context) error
	Lock(context.Context) error
	Unlock(context.Context) error
}

// recipeRW adapts etcd's recipe.RWMutex, which takes no context.
type recipeRW struct{ m *recipe.RWMutex }

func (r recipeRW) RLock(context.Context) error   { return r.m.RLock() }
func (r recipeRW) RUnlock(context.Context) error { return r.m.RUnlock() }
func (r recipeRW) Lock(context.Context) error    { return r.m.Lock() }
func (r recipeRW) Unlock(context.Context) error  { return r.m.Unlock() }

type rwImpl struct {
	name string
	// open readies cli for name and returns how to get the locker of one goroutine on it.
	open func(b *testing.B, cli *clientv3.Client, name string) func() rwLocker
}

var rwImpls = []rwImpl{
	{"etcdsync", func(b *testing.B, cli *clientv3.Client, name string) func() rwLocker {
		rw, err := rwmutex.New(cli, name)
		if err != nil {
			b.Fatal(err)
		}
		return func() rwLocker { return rw } // the goroutines of a client share one handle
	}},
	{"etcd", func(b *testing.B, cli *clientv3.Client, name string) func() rwLocker {
		s := benchSession(b, cli)
		// A recipe.RWMutex remembers one key: one per goroutine, on the client's session.
		return func() rwLocker { return recipeRW{recipe.NewRWMutex(s, name)} }
	}},
}

// BenchmarkReadersOneClient: 32 goroutines of one client read in a loop (RLock, a check
// that no writer is inside, RUnlock) while a writer on another client takes the write
// lock every 50 ms. Ours shares one *RWMutex among the 32, so that they share one read
// key; etcd's needs a recipe.RWMutex per goroutine, a key each, on the client's session.
func BenchmarkReadersOneClient(b *testing.B) {
	for _, im := range rwImpls {
		b.Run(im.name, func(b *testing.B) { benchReads(b, im, 1, 32) })
	}
}

// BenchmarkReaderClients: 8 clients with one reading goroutine each, beside the writer of
// BenchmarkReadersOneClient. Nothing is shared here: every read writes a key.
func BenchmarkReaderClients(b *testing.B) {
	for _, im := range rwImpls {
		b.Run(im.name, func(b *testing.B) { benchReads(b, im, 8, 1) })
	}
}

// benchReads runs perClient reading goroutines on each of clients clients and a writer on
// a client of its own, which tries at the start and then every writeEvery (so 20 writes/s
// at most). It reports reads/s, writes/s, the readers' RPCs per read and the writer's per
// write.
func benchReads(b *testing.B, im rwImpl, clients, perClient int) {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	name := benchName("reads")

	wcli, wcnt := benchClient(b)
	writer := im.open(b, wcli, name)()
	benchMust(b, writer.Lock(ctx)) // the first use grants our lease
	benchMust(b, writer.Unlock(ctx))
	var readers []rwLocker
	var counters []*rpcstat.Counter
	for range clients {
		cli, cnt := benchClient(b)
		open := im.open(b, cli, name)
		for i := range perClient {
			l := open()
			if i == 0 {
				benchMust(b, l.RLock(ctx))
				benchMust(b, l.RUnlock(ctx))
			}
			readers = append(readers, l)
		}
		counters = append(counters, cnt)
	}
	readersBefore, writerBefore := benchCounts(counters...), wcnt.Counts()

	var ex exclusion
	m := startMeasure(b)
	var writes measured
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(writeEvery)
		defer tick.Stop()
		for first := true; ; first = false {
			if !first {
				select {
				case <-m.over:
					return
				case <-tick.C:
				}
			}
			if err := writer.Lock(ctx); err != nil {
				b.Errorf("writer: Lock: %v", err)
				return
			}
			ex.write(writeHold)
			if err := writer.Unlock(ctx); err != nil {
				b.Errorf("writer: Unlock: %v", err)
				return
			}
			writes.add(m)
		}
	})
	reads := make([]measured, len(readers))
	for i, l := range readers {
		wg.Go(func() {
			var c measured // kept here: neighbours in reads would share a cache line
			defer func() { reads[i] = c }()
			for !m.ended() {
				if err := l.RLock(ctx); err != nil {
					b.Errorf("reader %d: RLock: %v", i, err)
					return
				}
				ex.read()
				if err := l.RUnlock(ctx); err != nil {
					b.Errorf("reader %d: RUnlock: %v", i, err)
					return
				}
				c.add(m)
			}
		})
	}
	wg.Wait()
	elapsed := m.stop(b)
	ex.check(b)
	if writes.within == 0 {
		// The readers then never met a writer, and the exclusion check proved nothing.
		if elapsed >= time.Second {
			b.Errorf("no write within %v: the writer starved", elapsed)
		} else {
			b.Logf("no write within %v: the exclusion check met no writer", elapsed)
		}
	}
	if b.Failed() {
		return
	}
	total := sumMeasured(reads)
	b.ReportMetric(float64(total.within)/elapsed.Seconds(), "reads/s")
	b.ReportMetric(float64(writes.within)/elapsed.Seconds(), "writes/s")
	reportPer(b, "", benchCounts(counters...).Sub(readersBefore), total.all, "read")
	reportPer(b, "writer-", wcnt.Counts().Sub(writerBefore), writes.all, "write")
}

type exclusive interface {
	Lock(context.Context) error
	Unlock(context.Context) error
}

var writeImpls = []struct {
	name string
	open func(b *testing.B, cli *clientv3.Client, name string) exclusive
}{
	{"etcdsync", func(b *testing.B, cli *clientv3.Client, name string) exclusive {
		rw, err := rwmutex.New(cli, name)
		if err != nil {
			b.Fatal(err)
		}
		return rw
	}},
	{"mutex", func(b *testing.B, cli *clientv3.Client, name string) exclusive {
		m, err := mutex.New(cli, name)
		if err != nil {
			b.Fatal(err)
		}
		return m
	}},
	{"etcd", func(b *testing.B, cli *clientv3.Client, name string) exclusive {
		return recipeRW{recipe.NewRWMutex(benchSession(b, cli), name)}
	}},
}

// BenchmarkWriteHandoff: 8 clients take the write lock in turn as fast as they can (Lock,
// a check that no other writer is inside, Unlock), so nearly every Lock is a hand-off.
// Beside ours and etcd's it runs our mutex.Mutex ("mutex"), the rate ours should be near.
func BenchmarkWriteHandoff(b *testing.B) {
	const clients = 8
	for _, im := range writeImpls {
		b.Run(im.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
			defer cancel()
			name := benchName("handoff")
			lockers, counters := make([]exclusive, clients), make([]*rpcstat.Counter, clients)
			for i := range lockers {
				var cli *clientv3.Client
				cli, counters[i] = benchClient(b)
				lockers[i] = im.open(b, cli, name)
				benchMust(b, lockers[i].Lock(ctx)) // grants our lease
				benchMust(b, lockers[i].Unlock(ctx))
			}
			before := benchCounts(counters...)
			var ex exclusion
			m := startMeasure(b)
			cycles := make([]measured, clients)
			var wg sync.WaitGroup
			for i, l := range lockers {
				wg.Go(func() {
					var c measured
					defer func() { cycles[i] = c }()
					for !m.ended() {
						if err := l.Lock(ctx); err != nil {
							b.Errorf("writer %d: Lock: %v", i, err)
							return
						}
						ex.write(0)
						if err := l.Unlock(ctx); err != nil {
							b.Errorf("writer %d: Unlock: %v", i, err)
							return
						}
						c.add(m)
					}
				})
			}
			wg.Wait()
			elapsed := m.stop(b)
			ex.check(b)
			if b.Failed() {
				return
			}
			total := sumMeasured(cycles)
			b.ReportMetric(float64(total.within)/elapsed.Seconds(), "writes/s")
			reportPer(b, "", benchCounts(counters...).Sub(before), total.all, "write")
		})
	}
}

// measure is one measurement: b.N windows of measureWindow from its start.
type measure struct {
	start   time.Time
	elapsed time.Duration // from the start to the end, set before over closes
	over    chan struct{} // closed at the end
	done    atomic.Bool   // set at the end: cheaper to poll than over
}

// startMeasure resets the timer and starts a measurement.
func startMeasure(b *testing.B) *measure {
	m := &measure{over: make(chan struct{})}
	b.ResetTimer()
	m.start = time.Now()
	time.AfterFunc(time.Duration(b.N)*measureWindow, func() {
		m.elapsed = time.Since(m.start)
		m.done.Store(true)
		close(m.over)
	})
	return m
}

func (m *measure) ended() bool { return m.done.Load() }

// stop stops the timer once the measurement has ended and returns its length.
func (m *measure) stop(b *testing.B) time.Duration {
	<-m.over
	b.StopTimer()
	return m.elapsed
}

// measured counts the acquisitions of one goroutine: within the measurement, and in all
// (also those that were under way at its end, which take the same RPCs).
type measured struct{ within, all int64 }

func (c *measured) add(m *measure) {
	c.all++
	if !m.ended() {
		c.within++
	}
}

func sumMeasured(cs []measured) measured {
	var sum measured
	for _, c := range cs {
		sum.within += c.within
		sum.all += c.all
	}
	return sum
}

// exclusion checks in the process what the lock promises across its clients: no reader
// inside beside a writer, no two writers. Each side marks itself inside, then looks for
// the other; the atomics are sequentially consistent, so a reader that comes in while a
// writer is inside sees it, and so does a writer that comes in while a reader is.
type exclusion struct {
	readers, writers, violations atomic.Int64
}

func (e *exclusion) read() {
	e.readers.Add(1)
	if e.writers.Load() != 0 {
		e.violations.Add(1)
	}
	e.readers.Add(-1)
}

// write stays inside for hold, or for a yield of the processor if hold is 0, and looks for
// others on the way in and on the way out.
func (e *exclusion) write(hold time.Duration) {
	if e.writers.Add(1) != 1 || e.readers.Load() != 0 {
		e.violations.Add(1)
	}
	if hold > 0 {
		time.Sleep(hold)
	} else {
		runtime.Gosched()
	}
	if e.writers.Load() != 1 || e.readers.Load() != 0 {
		e.violations.Add(1)
	}
	e.writers.Add(-1)
}

func (e *exclusion) check(b *testing.B) {
	if v := e.violations.Load(); v > 0 {
		b.Errorf("exclusion broken %d times: a reader beside a writer, or two writers", v)
	}
}

// benchClient is a client whose RPCs are counted, closed when the benchmark ends.
func benchClient(b *testing.B) (*clientv3.Client, *rpcstat.Counter) {
	cnt := &rpcstat.Counter{}
	return primtest.CountedClient(b, cluster, cnt), cnt
}

// benchSession is an etcd session on cli, closed when the benchmark ends (before cli: the
// cleanups run last first).
func benchSession(b *testing.B, cli *clientv3.Client) *concurrency.Session {
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func benchMust(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// benchCounts adds up the counts of counters so far.
func benchCounts(counters ...*rpcstat.Counter) rpcstat.Counts {
	sum := rpcstat.Counts{}
	for _, c := range counters {
		sum.Add(c.Counts())
	}
	return sum
}

// reportPer reports calls by method per op, as "<prefix><Method>/<op>". Keep-alive messages
// are left out: they go per lease and per TTL/3 of time, not per op.
func reportPer(b *testing.B, prefix string, counts rpcstat.Counts, ops int64, op string) {
	if ops == 0 {
		return
	}
	for _, m := range counts.Methods() {
		if m != "LeaseKeepAlive.send" {
			b.ReportMetric(float64(counts[m])/float64(ops), prefix+m+"/"+op)
		}
	}
}

var benchRun atomic.Int64 // keeps names apart between runs of one benchmark

func benchName(kind string) string {
	return fmt.Sprintf("bench-%s-%d", kind, benchRun.Add(1))
}
