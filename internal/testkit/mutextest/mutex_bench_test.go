package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
)

// Every benchmark runs ours ("etcdsync") and etcd's concurrency.Mutex ("etcd") on the same
// embedded server in the same run, and reports RPCs per operation by gRPC method (a
// "Watch" is a watch stream opened, "Watch.send" a watch created or cancelled on one).

type locker interface {
	Lock(context.Context) error
	TryLock(context.Context) error
	Unlock(context.Context) error
}

type impl struct {
	name string
	open func(b *testing.B, cli *clientv3.Client, name string) locker
}

var impls = []impl{
	{"etcdsync", func(b *testing.B, cli *clientv3.Client, name string) locker {
		m, err := mutex.New(cli, name)
		if err != nil {
			b.Fatal(err)
		}
		return m
	}},
	{"etcd", func(b *testing.B, cli *clientv3.Client, name string) locker {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return concurrency.NewMutex(s, name)
	}},
}

// benchClient is a client whose RPCs are counted.
func benchClient(b *testing.B) (*clientv3.Client, *rpcstat.Counter) {
	cnt := &rpcstat.Counter{}
	return primtest.CountedClient(b, cluster, cnt), cnt
}

// openWarm opens n lockers of im on name, each on its own counted client, and locks and
// unlocks each once, so that lease grants fall outside the measurement.
func openWarm(b *testing.B, im impl, name string, n int) ([]locker, []*rpcstat.Counter) {
	ctx := context.Background()
	lockers, counters := make([]locker, n), make([]*rpcstat.Counter, n)
	for i := range lockers {
		var cli *clientv3.Client
		cli, counters[i] = benchClient(b)
		lockers[i] = im.open(b, cli, name)
		mustLock(b, ctx, lockers[i])
		mustUnlock(b, ctx, lockers[i])
	}
	return lockers, counters
}

// reportRPCs reports calls per op by method, each metric's name prefixed with prefix.
func reportRPCs(b *testing.B, prefix string, counts rpcstat.Counts, ops int) {
	for _, m := range counts.Methods() {
		b.ReportMetric(float64(counts[m])/float64(ops), prefix+m+"/op")
	}
}

func mustLock(b *testing.B, ctx context.Context, l locker) {
	if err := l.Lock(ctx); err != nil {
		b.Fatal(err)
	}
}

func mustUnlock(b *testing.B, ctx context.Context, l locker) {
	if err := l.Unlock(ctx); err != nil {
		b.Fatal(err)
	}
}

var benchRun atomic.Int64 // keeps names apart between runs of one benchmark

func benchName(kind string) string {
	return fmt.Sprintf("bench-%s-%d", kind, benchRun.Add(1))
}

// BenchmarkUncontended: lock+unlock cycles of one client alone. Ours and etcd's alternate
// cycle by cycle on the same server, so both meet the same server state (run-to-run noise
// on a 2-core machine is larger than the difference); it reports each one's time and RPCs
// per cycle, and speed-vs-etcd: etcd's time over ours, above 1 when ours is faster.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	type side struct {
		l      locker
		cnt    *rpcstat.Counter
		before rpcstat.Counts
		spent  time.Duration
	}
	sides := make([]*side, len(impls))
	for i, im := range impls {
		cli, cnt := benchClient(b)
		l := im.open(b, cli, benchName("uncontended"))
		mustLock(b, ctx, l) // the first use grants the lease
		mustUnlock(b, ctx, l)
		sides[i] = &side{l: l, cnt: cnt, before: cnt.Counts()}
	}
	b.ResetTimer()
	for range b.N {
		for _, s := range sides {
			start := time.Now()
			mustLock(b, ctx, s.l)
			mustUnlock(b, ctx, s.l)
			s.spent += time.Since(start)
		}
	}
	b.StopTimer()
	for i, s := range sides {
		b.ReportMetric(float64(s.spent.Microseconds())/float64(b.N), impls[i].name+"-us/cycle")
		reportRPCs(b, impls[i].name+"-", s.cnt.Counts().Sub(s.before), b.N)
	}
	b.ReportMetric(float64(sides[1].spent)/float64(sides[0].spent), "speed-vs-etcd")
}

// BenchmarkContended: n clients lock+unlock one name as fast as they can; an op is one
// lock cycle of any client.
func BenchmarkContended(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{2, 8} {
		for _, im := range impls {
			b.Run(fmt.Sprintf("clients=%d/%s", n, im.name), func(b *testing.B) {
				lockers, counters := openWarm(b, im, benchName("contended"), n)
				before := rpcstat.Counts{}
				for _, c := range counters {
					before.Add(c.Counts())
				}
				var left atomic.Int64
				left.Store(int64(b.N))
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for _, l := range lockers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for left.Add(-1) >= 0 {
							if err := l.Lock(ctx); err != nil {
								b.Error(err)
								return
							}
							if err := l.Unlock(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				after := rpcstat.Counts{}
				for _, c := range counters {
					after.Add(c.Counts())
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
				reportRPCs(b, "", after.Sub(before), b.N)
			})
		}
	}
}

// BenchmarkHandoff: the time from the holder's Unlock returning to the next waiter's Lock
// returning (0 when the waiter's Lock returned first: the delete event can reach it before
// the holder has its Txn's answer), and the waiter's RPCs per contended Lock. "fresh": the
// holder unlocks as soon as the waiter is in line, as under contention; "settled": the
// waiter has waited 150 ms.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	for _, wait := range []time.Duration{0, 150 * time.Millisecond} {
		variant := "fresh"
		if wait > 0 {
			variant = "settled"
		}
		for _, im := range impls {
			b.Run(variant+"/"+im.name, func(b *testing.B) {
				name := benchName("handoff")
				admin := cluster.Client(b)
				l, cnt := openWarm(b, im, name, 2)
				var total time.Duration
				waiterRPCs := rpcstat.Counts{}
				mustLock(b, ctx, l[0])
				b.ResetTimer()
				for i := range b.N {
					holder, waiter := l[i%2], l[(i+1)%2]
					before := cnt[(i+1)%2].Counts()
					locked := make(chan time.Time, 1)
					go func() {
						if err := waiter.Lock(ctx); err != nil {
							b.Error(err)
						}
						locked <- time.Now()
					}()
					etcdtest.AwaitKeys(b, admin, name+"/", 2)
					if wait > 0 {
						time.Sleep(wait)
					}
					mustUnlock(b, ctx, holder)
					unlocked := time.Now()
					total += max(0, (<-locked).Sub(unlocked))
					waiterRPCs.Add(cnt[(i+1)%2].Counts().Sub(before))
				}
				b.StopTimer()
				mustUnlock(b, ctx, l[b.N%2])
				b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/handoff")
				reportRPCs(b, "", waiterRPCs, b.N)
			})
		}
	}
}

// BenchmarkTryLockFails: TryLock on a name another client holds. writes/op counts the
// revisions it adds: each put or delete is one.
func BenchmarkTryLockFails(b *testing.B) {
	ctx := context.Background()
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			name := benchName("trylock")
			holderCli, _ := benchClient(b)
			holder := im.open(b, holderCli, name)
			mustLock(b, ctx, holder)
			cli, cnt := benchClient(b)
			l := im.open(b, cli, name)
			warm := im.open(b, cli, benchName("warm")) // grants the lease outside the loop
			mustLock(b, ctx, warm)
			mustUnlock(b, ctx, warm)
			rev := func() int64 {
				resp, err := cli.Get(ctx, "\x00")
				if err != nil {
					b.Fatal(err)
				}
				return resp.Header.Revision
			}
			revBefore, before := rev(), cnt.Counts()
			b.ResetTimer()
			for range b.N {
				if err := l.TryLock(ctx); !errors.Is(err, mutex.ErrLocked) && !errors.Is(err, concurrency.ErrLocked) {
					b.Fatalf("TryLock: %v", err)
				}
			}
			b.StopTimer()
			counts := cnt.Counts().Sub(before) // taken before rev()'s own Range
			revAfter := rev()
			reportRPCs(b, "", counts, b.N)
			b.ReportMetric(float64(revAfter-revBefore)/float64(b.N), "writes/op")
			mustUnlock(b, ctx, holder)
		})
	}
}
