package mutex_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
)

// transferAccounts and transferClients are BenchmarkTransfer's shape: 8 clients moving
// amounts between random pairs of 16 accounts, each transfer under a hold of both.
const transferAccounts, transferClients = 16, 8

// pairLocker takes the two names of a transfer and gives them back.
type pairLocker interface {
	lock(ctx context.Context, a, b int) error
	unlock(ctx context.Context, a, b int) error
}

// transferWay is one way to hold two names, opened once per client.
type transferWay struct {
	name string
	open func(b *testing.B, cli *clientv3.Client, accounts []string) pairLocker
}

var transferWays = []transferWay{
	{"multi", openMultiPairs},
	{"mutexes", openMutexPairs},
	{"etcd", openEtcdPairs},
}

// BenchmarkTransfer: transfers between random pairs of 16 accounts by 8 clients, each under
// a Multi of its two accounts ("multi"), under two Mutexes taken in sorted order
// ("mutexes"), and under two of etcd's concurrency.Mutex in sorted order ("etcd"), one way
// after the other in the same run on the same server, b.N transfers each. It reports each
// way's transfers per second and RPCs per transfer, and multi-vs-etcd and
// multi-vs-mutexes: the rate of Multi over the other's, above 1 when Multi is faster.
func BenchmarkTransfer(b *testing.B) {
	rates := map[string]float64{}
	var report []func() // b.ReportMetric's, once every way has run: ResetTimer drops them
	b.StopTimer()
	for _, way := range transferWays {
		accounts := make([]string, transferAccounts)
		for i := range accounts {
			accounts[i] = fmt.Sprintf("%s-%d", benchName("transfer-"+way.name), i)
		}
		lockers := make([]pairLocker, transferClients)
		counters := make([]*rpcstat.Counter, transferClients)
		for i := range lockers {
			var cli *clientv3.Client
			cli, counters[i] = benchClient(b)
			lockers[i] = way.open(b, cli, accounts)
			// Warm up: the lease, and a first hold of every account.
			for a := 0; a < transferAccounts; a += 2 {
				mustPair(b, lockers[i], a, a+1)
			}
		}
		before := rpcstat.Counts{}
		for _, c := range counters {
			before.Add(c.Counts())
		}
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for i, l := range lockers {
			n := b.N / transferClients
			if i < b.N%transferClients {
				n++
			}
			rng := rand.New(rand.NewPCG(uint64(i), 29))
			wg.Go(func() {
				for range n {
					a := rng.IntN(transferAccounts)
					c := (a + 1 + rng.IntN(transferAccounts-1)) % transferAccounts
					mustPair(b, l, a, c)
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		after := rpcstat.Counts{}
		for _, c := range counters {
			after.Add(c.Counts())
		}
		rates[way.name] = float64(b.N) / elapsed.Seconds()
		rpcs := after.Sub(before)
		total := int64(0)
		for _, n := range rpcs {
			total += n
		}
		report = append(report, func() {
			b.ReportMetric(rates[way.name], way.name+"-transfers/s")
			b.ReportMetric(float64(total)/float64(b.N), way.name+"-rpc/transfer")
			reportRPCs(b, way.name+"-", rpcs, b.N)
		})
	}
	for _, r := range report {
		r()
	}
	b.ReportMetric(rates["multi"]/rates["etcd"], "multi-vs-etcd")
	b.ReportMetric(rates["multi"]/rates["mutexes"], "multi-vs-mutexes")
}

// mustPair holds the accounts a and c and gives them back: one transfer.
func mustPair(b *testing.B, l pairLocker, a, c int) {
	ctx := context.Background()
	if err := l.lock(ctx, a, c); err != nil {
		b.Fatal(err)
	}
	if err := l.unlock(ctx, a, c); err != nil {
		b.Fatal(err)
	}
}

// multiPairs holds a pair with one Multi, made for each pair on first use.
type multiPairs struct {
	b        *testing.B
	cli      *clientv3.Client
	accounts []string
	multis   map[[2]int]*mutex.Multi
}

func openMultiPairs(b *testing.B, cli *clientv3.Client, accounts []string) pairLocker {
	return &multiPairs{b: b, cli: cli, accounts: accounts, multis: map[[2]int]*mutex.Multi{}}
}

func (p *multiPairs) of(a, c int) *mutex.Multi {
	k := [2]int{min(a, c), max(a, c)}
	m := p.multis[k]
	if m == nil {
		var err error
		if m, err = mutex.NewMulti(p.cli, []string{p.accounts[a], p.accounts[c]}); err != nil {
			p.b.Fatal(err)
		}
		p.multis[k] = m
	}
	return m
}

func (p *multiPairs) lock(ctx context.Context, a, c int) error   { return p.of(a, c).Lock(ctx) }
func (p *multiPairs) unlock(ctx context.Context, a, c int) error { return p.of(a, c).Unlock(ctx) }

// sortedPairs holds a pair with two lockers of one client, taken in the order of the
// accounts and given back in the reverse order.
type sortedPairs struct{ lockers []locker }

func openMutexPairs(b *testing.B, cli *clientv3.Client, accounts []string) pairLocker {
	p := &sortedPairs{}
	for _, name := range accounts {
		p.lockers = append(p.lockers, impls[0].open(b, cli, name))
	}
	return p
}

func openEtcdPairs(b *testing.B, cli *clientv3.Client, accounts []string) pairLocker {
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	p := &sortedPairs{}
	for _, name := range accounts {
		p.lockers = append(p.lockers, concurrency.NewMutex(s, name))
	}
	return p
}

func (p *sortedPairs) lock(ctx context.Context, a, c int) error {
	first, second := min(a, c), max(a, c)
	if err := p.lockers[first].Lock(ctx); err != nil {
		return err
	}
	if err := p.lockers[second].Lock(ctx); err != nil {
		_ = p.lockers[first].Unlock(ctx)
		return err
	}
	return nil
}

func (p *sortedPairs) unlock(ctx context.Context, a, c int) error {
	err := p.lockers[max(a, c)].Unlock(ctx)
	if uerr := p.lockers[min(a, c)].Unlock(ctx); err == nil {
		err = uerr
	}
	return err
}
