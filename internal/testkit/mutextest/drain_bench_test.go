package mutex_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
)

const (
	drainClients = 8               // the lockers of a drain are spread round-robin over these
	drainTimeout = 3 * time.Minute // per drain, so that a lost hand-off fails instead of hanging
)

// drainImpl is one side of BenchmarkDrain. impls' open does not fit: etcd's side would
// grant a lease per locker per drain and keep all of them until the benchmark ends.
type drainImpl struct {
	name string
	// prepare readies n lockers spread round-robin over clients and returns how to open
	// locker i on a name; a locker is opened afresh for every name.
	prepare func(b *testing.B, clients []*clientv3.Client, n int) func(i int, name string) locker
}

var drainImpls = []drainImpl{
	{"etcdsync", func(b *testing.B, clients []*clientv3.Client, n int) func(int, string) locker {
		// Every handle on a client shares that client's one lease.
		return func(i int, name string) locker {
			m, err := mutex.New(clients[i%len(clients)], name)
			if err != nil {
				b.Fatal(err)
			}
			return m
		}
	}},
	{"etcd", func(b *testing.B, clients []*clientv3.Client, n int) func(int, string) locker {
		// etcd's key is <name>/<lease>: two Mutexes on one session would share it, so every
		// locker has its own session (a lease and its keep-alives), reused across names.
		sessions := make([]*concurrency.Session, n)
		for i := range sessions {
			s, err := concurrency.NewSession(clients[i%len(clients)])
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			sessions[i] = s
		}
		return func(i int, name string) locker { return concurrency.NewMutex(sessions[i], name) }
	}},
}

// BenchmarkDrain: how fast a queue of waiters on one name drains. A holder takes the lock,
// n waiters queue behind it, each in its own goroutine, then the holder unlocks and each
// waiter unlocks as soon as its Lock returns. An op is one whole drain (each op queues n
// waiters afresh on a fresh name, so no tombstones of an earlier drain are in the range);
// handoffs/s counts waiters served per second, from the holder's Unlock to the last
// waiter's Lock returning. The sides run as separate sub-benchmarks: ours vs etcd is the
// ratio of their handoffs/s, for the reader to take.
//
// <Method>/handoff counts every RPC of the drain, per waiter served: queueing (the waiters'
// Lock calls before the hand-offs start), the hand-offs and every release, the holder's
// included. Keep-alive messages are left out: they go per lease and per TTL/3 of time, not
// per hand-off, and a fresh etcd session sends its first one up to 500 ms after it is
// made, which would charge session set-up to the drain (lease grants and keep-alive
// streams are counted, so a lease per lock would show).
func BenchmarkDrain(b *testing.B) {
	for _, n := range []int{200, 1000} {
		for _, im := range drainImpls {
			b.Run(fmt.Sprintf("waiters=%d/%s", n, im.name), func(b *testing.B) {
				benchDrain(b, im, n)
			})
		}
	}
}

func benchDrain(b *testing.B, im drainImpl, n int) {
	admin := cluster.Client(b)
	clients, counters := make([]*clientv3.Client, drainClients), make([]*rpcstat.Counter, drainClients)
	for i := range clients {
		clients[i], counters[i] = benchClient(b)
	}
	open := im.prepare(b, clients, n+1) // locker n is the holder, 0..n-1 the waiters
	warm := benchName("drain-warm")     // grants our leases outside the counts
	for i := range min(n+1, len(clients)) {
		l := open(i, warm)
		mustLock(b, context.Background(), l)
		mustUnlock(b, context.Background(), l)
	}

	// Registered after the clients' and sessions' Cleanup, so it runs before them: a
	// benchmark stopped by Fatal cancels its waiters and waits for them while etcd is up.
	stop, cancelAll := context.WithCancel(context.Background())
	var waiters sync.WaitGroup
	b.Cleanup(func() {
		cancelAll()
		waiters.Wait()
	})

	var spent time.Duration
	rpcs := rpcstat.Counts{}
	b.StopTimer()
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithTimeout(stop, drainTimeout)
		name := benchName("drain")
		before := sumCounts(counters)
		holder := open(n, name)
		mustLock(b, ctx, holder)
		served := make([]time.Time, n)
		for i := range n {
			waiter := open(i, name)
			waiters.Add(1)
			go func() {
				defer waiters.Done()
				if err := waiter.Lock(ctx); err != nil {
					b.Errorf("waiter %d: Lock: %v", i, err)
					return
				}
				served[i] = time.Now()
				if err := waiter.Unlock(ctx); err != nil {
					b.Errorf("waiter %d: Unlock: %v", i, err)
				}
			}()
		}
		etcdtest.AwaitKeys(b, admin, name+"/", int64(n+1)) // the holder's key and every waiter's

		b.StartTimer()
		start := time.Now()
		mustUnlock(b, ctx, holder)
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

// sumCounts adds up the counts of counters so far.
func sumCounts(counters []*rpcstat.Counter) rpcstat.Counts {
	sum := rpcstat.Counts{}
	for _, c := range counters {
		sum.Add(c.Counts())
	}
	return sum
}
