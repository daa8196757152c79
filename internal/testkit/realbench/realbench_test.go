package realbench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// Every benchmark measures ours ("ours") against etcd's own ("etcd": concurrency.Mutex,
// recipe.RWMutex, concurrency.Election; for the semaphore, which etcd lacks, our mutex,
// "mutex") and the sequential commit rate of the same cluster ("leader", and "follower" on
// several members: one client Putting one key over and over, pinned to that member), in
// interleaved rounds; see report for the metrics. Each side has clients of its own, pinned
// to members 0, 1, 2, 0, ... and warmed up by one cycle each, so that lease grants and
// sessions fall outside the rounds.

// BenchmarkMutexUncontended: one client locks and unlocks in a loop; an op is a cycle.
func BenchmarkMutexUncontended(b *testing.B) {
	forEachCluster(b, func(b *testing.B, t *target) { benchMutex(b, t, 1) })
}

// BenchmarkMutexContended: 2 or 8 clients lock and unlock one name in a loop; an op is a
// cycle of any client.
func BenchmarkMutexContended(b *testing.B) {
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range []int{2, 8} {
			b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchMutex(b, t, n) })
		}
	})
}

func benchMutex(b *testing.B, t *target, n int) {
	ctx := context.Background()
	ours := t.oursClients(b, n)
	oursWork := make([]func(context.Context) error, n)
	for i, cli := range ours {
		m, err := mutex.New(cli.Client, "mutex", mutex.WithPrefix(t.root))
		must(b, err)
		oursWork[i] = exclusiveCycle(m, nil)
	}
	etcd, sessions := t.etcdClients(b, n)
	etcdWork := make([]func(context.Context) error, n)
	for i, s := range sessions {
		etcdWork[i] = exclusiveCycle(concurrency.NewMutex(s, t.root+"etcd-mutex"), nil)
	}
	warm(b, ctx, oursWork, etcdWork)
	t.measure(b, comparison{
		ours:    loopSide("ours", "cycle", ours, oursWork),
		rival:   loopSide("etcd", "cycle", etcd, etcdWork),
		commits: t.commitSides(b),
	})
}

const (
	rwReaders  = 8
	writeEvery = 50 * time.Millisecond // the writer's cadence in BenchmarkRWMutexReadHeavy
	writeHold  = time.Millisecond      // how long it stays inside: a reader let in beside it would find it
)

// BenchmarkRWMutexReadHeavy: 8 clients take the read lock in a loop while a writer on a
// client of its own takes the write lock every 50 ms (20 writes/s at most); the headline op
// is a read, the writes are reported beside. etcd's recipe.RWMutex takes no context and
// remembers one key, so each reading client has one of its own. It fails if a reader was
// ever inside beside the writer.
func BenchmarkRWMutexReadHeavy(b *testing.B) {
	forEachCluster(b, func(b *testing.B, t *target) {
		ctx := context.Background()
		ours, oursWriter := t.oursClients(b, rwReaders), t.oursClientsFrom(b, 1, rwReaders)
		var oursRW []rwLocker
		for _, cli := range append(ours, oursWriter...) {
			rw, err := rwmutex.New(cli.Client, "rw", rwmutex.WithPrefix(t.root))
			must(b, err)
			oursRW = append(oursRW, rw)
		}
		etcd, sessions := t.etcdClients(b, rwReaders)
		etcdWriter, writerSession := t.etcdClientsFrom(b, 1, rwReaders)
		var etcdRW []rwLocker
		for _, s := range append(sessions, writerSession...) {
			etcdRW = append(etcdRW, recipeRW{recipe.NewRWMutex(s, t.root+"etcd-rw")})
		}
		for _, l := range append(oursRW, etcdRW...) { // grants our leases
			must(b, l.Lock(ctx))
			must(b, l.Unlock(ctx))
		}
		t.measure(b, comparison{
			ours:    readHeavySide("ours", ours, oursWriter, oursRW),
			rival:   readHeavySide("etcd", etcd, etcdWriter, etcdRW),
			commits: t.commitSides(b),
		})
	})
}

// readHeavySide reads with lockers[:len(readers)], one per reading client, and writes with
// the last locker, on the writer's client.
func readHeavySide(name string, readers, writer []counted, lockers []rwLocker) side {
	reads := make([]func(context.Context) error, len(readers))
	ex := &exclusion{}
	for i, l := range lockers[:len(readers)] {
		reads[i] = func(ctx context.Context) error {
			if err := l.RLock(ctx); err != nil {
				return fmt.Errorf("RLock: %w", err)
			}
			ex.read()
			return l.RUnlock(ctx)
		}
	}
	w := lockers[len(readers)]
	return side{name: name, run: func(ctx context.Context, d time.Duration) (tally, error) {
		readersBefore, writerBefore := countsOf(readers), countsOf(writer)
		win := openWindow(d)
		var writes measured
		writeErr := make(chan error, 1)
		go func() {
			tick := time.NewTicker(writeEvery)
			defer tick.Stop()
			for {
				if err := exclusiveCycle(w, func() { ex.write(writeHold) })(ctx); err != nil {
					writeErr <- err
					return
				}
				writes.add(win)
				select {
				case <-win.over:
					writeErr <- nil
					return
				case <-tick.C:
				}
			}
		}()
		m, err := loop(ctx, win, reads)
		if werr := <-writeErr; werr != nil && err == nil {
			err = fmt.Errorf("writer: %w", werr)
		}
		if err == nil {
			err = ex.check()
		}
		return tally{win.length(), []count{
			{"read", m.within, m.all, countsOf(readers).Sub(readersBefore)},
			{"write", writes.within, writes.all, countsOf(writer).Sub(writerBefore)},
		}, nil}, err
	}}
}

// BenchmarkRWMutexWriters: 8 clients take the write lock of one name in a loop; an op is a
// write cycle of any client. It fails if two writers were ever inside at once.
func BenchmarkRWMutexWriters(b *testing.B) {
	const n = 8
	forEachCluster(b, func(b *testing.B, t *target) {
		ctx := context.Background()
		ours := t.oursClients(b, n)
		oursEx, etcdEx := &exclusion{}, &exclusion{}
		oursWork := make([]func(context.Context) error, n)
		for i, cli := range ours {
			rw, err := rwmutex.New(cli.Client, "rw", rwmutex.WithPrefix(t.root))
			must(b, err)
			oursWork[i] = exclusiveCycle(rw, func() { oursEx.write(0) })
		}
		etcd, sessions := t.etcdClients(b, n)
		etcdWork := make([]func(context.Context) error, n)
		for i, s := range sessions {
			etcdWork[i] = exclusiveCycle(recipeRW{recipe.NewRWMutex(s, t.root+"etcd-rw")}, func() { etcdEx.write(0) })
		}
		warm(b, ctx, oursWork, etcdWork)
		t.measure(b, comparison{
			ours:    checked(loopSide("ours", "write", ours, oursWork), oursEx),
			rival:   checked(loopSide("etcd", "write", etcd, etcdWork), etcdEx),
			commits: t.commitSides(b),
		})
	})
}

// BenchmarkSemaphore: 8 clients acquire and release one unit of a semaphore of 4 in a loop;
// an op is a permit's cycle. etcd has no semaphore: the rival is our mutex, 8 other clients
// contending for one name as in BenchmarkMutexContended, beside the commit rate.
func BenchmarkSemaphore(b *testing.B) {
	const n, limit = 8, 4
	forEachCluster(b, func(b *testing.B, t *target) {
		ctx := context.Background()
		ours := t.oursClients(b, n)
		oursWork := make([]func(context.Context) error, n)
		for i, cli := range ours {
			s, err := semaphore.New(cli.Client, "sem", limit, semaphore.WithPrefix(t.root))
			must(b, err)
			oursWork[i] = func(ctx context.Context) error {
				p, err := s.Acquire(ctx)
				if err != nil {
					return fmt.Errorf("Acquire: %w", err)
				}
				return p.Release(ctx)
			}
		}
		mutexes := t.oursClients(b, n)
		mutexWork := make([]func(context.Context) error, n)
		for i, cli := range mutexes {
			m, err := mutex.New(cli.Client, "sem-mutex", mutex.WithPrefix(t.root))
			must(b, err)
			mutexWork[i] = exclusiveCycle(m, nil)
		}
		warm(b, ctx, oursWork, mutexWork)
		t.measure(b, comparison{
			ours:    loopSide("ours", "permit", ours, oursWork),
			rival:   loopSide("mutex", "cycle", mutexes, mutexWork),
			commits: t.commitSides(b),
		})
	})
}

// BenchmarkElection: 3 candidates on 3 clients each campaign, resign once elected, and
// campaign again, in a loop; an op is a term, so the rate is of leadership hand-offs.
func BenchmarkElection(b *testing.B) {
	const n = 3
	forEachCluster(b, func(b *testing.B, t *target) {
		ctx := context.Background()
		ours := t.oursClients(b, n)
		oursWork := make([]func(context.Context) error, n)
		for i, cli := range ours {
			e, err := election.New(cli.Client, "election", election.WithPrefix(t.root))
			must(b, err)
			oursWork[i] = term(e)
		}
		etcd, sessions := t.etcdClients(b, n)
		etcdWork := make([]func(context.Context) error, n)
		for i, s := range sessions {
			etcdWork[i] = term(concurrency.NewElection(s, t.root+"etcd-election"))
		}
		warm(b, ctx, oursWork, etcdWork)
		t.measure(b, comparison{
			ours:    loopSide("ours", "term", ours, oursWork),
			rival:   loopSide("etcd", "term", etcd, etcdWork),
			commits: t.commitSides(b),
		})
	})
}

type candidate interface {
	Campaign(ctx context.Context, value string) error
	Resign(ctx context.Context) error
}

// term is one term of c: it campaigns until elected, then resigns.
func term(c candidate) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := c.Campaign(ctx, "v"); err != nil {
			return fmt.Errorf("Campaign: %w", err)
		}
		return c.Resign(ctx)
	}
}

// measure runs the rounds of c b.N times (once with the default -benchtime) and reports them.
func (t *target) measure(b *testing.B, c comparison) {
	rounds, d := settings(b)
	sides := 2 + len(c.commits)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(b.N*rounds*sides)*d+2*time.Minute+time.Duration(b.N*rounds)*c.slack)
	defer cancel()
	sc, unread := t.metrics, error(nil)
	if _, err := sc.sample(ctx); err != nil { // e.g. an external cluster without /metrics there
		sc, unread = nil, fmt.Errorf("no server metrics: %w", err)
	}
	c.ours, c.rival = observed(c.ours, sc, t.leader, unread), observed(c.rival, sc, t.leader, unread)
	for i, s := range c.commits {
		c.commits[i] = observed(s, sc, t.leader, unread)
	}
	all := results{}
	b.ResetTimer()
	for range b.N {
		res, err := runRounds(ctx, c, rounds, d)
		if err != nil {
			b.Fatal(err)
		}
		for name, ts := range res {
			all[name] = append(all[name], ts...)
		}
	}
	b.StopTimer()
	report(b, fmt.Sprintf("members=%d, leader m%d, %d rounds of %v", t.cluster.Size(), t.leader, rounds*b.N, d), c, all)
}

// commitSides are the sequential commits on the leader and, on several members, on the
// follower after it.
func (t *target) commitSides(b *testing.B) []side {
	sides := []side{t.commitSide(b, "leader", t.leader)}
	if size := t.cluster.Size(); size > 1 {
		sides = append(sides, t.commitSide(b, "follower", (t.leader+1)%size))
	}
	return sides
}

func (t *target) commitSide(b *testing.B, name string, member int) side {
	cli := t.clients(b, 1, member)
	key := t.root + "commit-" + name
	put := func(ctx context.Context) error {
		_, err := cli[0].Put(ctx, key, "x")
		return err
	}
	must(b, put(context.Background()))
	return loopSide(name, "commit", cli, []func(context.Context) error{put})
}

// oursClients are n clients from member 0 on whose leases our primitives revoke when b
// ends (Shutdown), before the clients close.
func (t *target) oursClients(b *testing.B, n int) []counted { return t.oursClientsFrom(b, n, 0) }

func (t *target) oursClientsFrom(b *testing.B, n, first int) []counted {
	clients := t.clients(b, n, first)
	for _, cli := range clients {
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := mutex.Shutdown(ctx, cli.Client); err != nil {
				b.Errorf("Shutdown: %v", err)
			}
		})
	}
	return clients
}

// etcdClients are n clients from member 0, each with an etcd session closed when b ends,
// before the clients close.
func (t *target) etcdClients(b *testing.B, n int) ([]counted, []*concurrency.Session) {
	return t.etcdClientsFrom(b, n, 0)
}

func (t *target) etcdClientsFrom(b *testing.B, n, first int) ([]counted, []*concurrency.Session) {
	clients := t.clients(b, n, first)
	sessions := make([]*concurrency.Session, n)
	for i, cli := range clients {
		s, err := concurrency.NewSession(cli.Client)
		must(b, err)
		b.Cleanup(func() { s.Close() })
		sessions[i] = s
	}
	return clients, sessions
}

// warm runs every worker once, one after another, so that the first use of a client (our
// lease grant) falls outside the rounds.
func warm(b *testing.B, ctx context.Context, workers ...[]func(context.Context) error) {
	for _, ws := range workers {
		for _, w := range ws {
			must(b, w(ctx))
		}
	}
}

type exclusive interface {
	Lock(context.Context) error
	Unlock(context.Context) error
}

// exclusiveCycle is a Lock, inside (if not nil) and an Unlock of l.
func exclusiveCycle(l exclusive, inside func()) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := l.Lock(ctx); err != nil {
			return fmt.Errorf("Lock: %w", err)
		}
		if inside != nil {
			inside()
		}
		return l.Unlock(ctx)
	}
}

type rwLocker interface {
	exclusive
	RLock(context.Context) error
	RUnlock(context.Context) error
}

// recipeRW adapts etcd's recipe.RWMutex, which takes no context.
type recipeRW struct{ m *recipe.RWMutex }

func (r recipeRW) RLock(context.Context) error   { return r.m.RLock() }
func (r recipeRW) RUnlock(context.Context) error { return r.m.RUnlock() }
func (r recipeRW) Lock(context.Context) error    { return r.m.Lock() }
func (r recipeRW) Unlock(context.Context) error  { return r.m.Unlock() }

// exclusion checks in the process what a readers/writer lock promises across its clients:
// no reader inside beside a writer, no two writers. Each side marks itself inside, then
// looks for the other; the atomics are sequentially consistent, so whichever comes second
// sees the first.
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

func (e *exclusion) check() error {
	if v := e.violations.Load(); v > 0 {
		return fmt.Errorf("exclusion broken %d times: a reader beside a writer, or two writers", v)
	}
	return nil
}

// checked fails a round of s in which ex saw a violation.
func checked(s side, ex *exclusion) side {
	run := s.run
	s.run = func(ctx context.Context, d time.Duration) (tally, error) {
		t, err := run(ctx, d)
		if err == nil {
			err = ex.check()
		}
		return t, err
	}
	return s
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
