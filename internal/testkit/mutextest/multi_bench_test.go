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

// transferRounds is how many turns the ways take in BenchmarkTransfer: interleaved, so
// that the load of the rest of the machine falls on each alike.
const transferRounds = 6

// BenchmarkTransfer: transfers between random pairs of 16 accounts by 8 clients, each under
// a Multi of its two accounts ("multi"), under two Mutexes taken in sorted order
// ("mutexes"), and under two of etcd's concurrency.Mutex in sorted order ("etcd"), on the
// same server in the same run, b.N transfers each, the ways taking turns in rounds. It
// reports each way's transfers per second and RPCs per transfer, and multi-vs-etcd and
// multi-vs-mutexes: the rate of Multi over the other's, above 1 when Multi is faster.
// ns/op is the time of one transfer of each way together.
func BenchmarkTransfer(b *testing.B) {
	type side struct {
		lockers  []pairLocker
		counters []*rpcstat.Counter
		rngs     []*rand.Rand
		before   rpcstat.Counts
		spent    time.Duration
	}
	sides := make([]*side, len(transferWays))
	for w, way := range transferWays {
		s := &side{}
		accounts := make([]string, transferAccounts)
		for i := range accounts {
			accounts[i] = fmt.Sprintf("%s-%d", benchName("transfer-"+way.name), i)
		}
		for i := range transferClients {
			cli, cnt := benchClient(b)
			l := way.open(b, cli, accounts)
			// Warm up: the lease, and a first hold of every account.
			for a := 0; a < transferAccounts; a += 2 {
				mustPair(b, l, a, a+1)
			}
			s.lockers, s.counters = append(s.lockers, l), append(s.counters, cnt)
			s.rngs = append(s.rngs, rand.New(rand.NewPCG(uint64(i), 29)))
		}
		s.before = rpcstat.Counts{}
		for _, c := range s.counters {
			s.before.Add(c.Counts())
		}
		sides[w] = s
	}
	b.ResetTimer()
	for r := range transferRounds {
		share := b.N / transferRounds
		if r < b.N%transferRounds {
			share++
		}
		for k := range sides {
			s := sides[(r+k)%len(sides)] // each way goes first in turn
			start := time.Now()
			var wg sync.WaitGroup
			for i, l := range s.lockers {
				n := share / transferClients
				if i < share%transferClients {
					n++
				}
				rng := s.rngs[i]
				wg.Go(func() {
					for range n {
						a := rng.IntN(transferAccounts)
						c := (a + 1 + rng.IntN(transferAccounts-1)) % transferAccounts
						mustPair(b, l, a, c)
					}
				})
			}
			wg.Wait()
			s.spent += time.Since(start)
		}
	}
	b.StopTimer()
	rates := map[string]float64{}
	for w, s := range sides {
		name := transferWays[w].name
		after := rpcstat.Counts{}
		for _, c := range s.counters {
			after.Add(c.Counts())
		}
		rpcs := after.Sub(s.before)
		total := int64(0)
		for _, n := range rpcs {
			total += n
		}
		rates[name] = float64(b.N) / s.spent.Seconds()
		b.ReportMetric(rates[name], name+"-transfers/s")
		b.ReportMetric(float64(total)/float64(b.N), name+"-rpc/transfer")
		reportRPCs(b, name+"-", rpcs, b.N)
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
