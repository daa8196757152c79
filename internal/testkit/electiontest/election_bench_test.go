package election_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// Every benchmark runs ours ("etcdsync") and etcd's concurrency.Election ("etcd") on the
// same embedded server in the same run, alternating op by op so that both meet the same
// server state, and reports each one's time and speed-vs-etcd: etcd's time over ours,
// above 1 when ours is faster.

type candidateAPI interface {
	Campaign(ctx context.Context, value string) error
	Proclaim(ctx context.Context, value string) error
	Resign(ctx context.Context) error
}

type impl struct {
	name     string
	open     func(b *testing.B, name string) candidateAPI
	observe  func(ctx context.Context, b *testing.B, name string) <-chan string
	keyspace func(name string) string
}

var impls = []impl{
	{
		name: "etcdsync",
		open: func(b *testing.B, name string) candidateAPI {
			e, err := election.New(cluster.Client(b), name)
			if err != nil {
				b.Fatal(err)
			}
			return e
		},
		observe: func(ctx context.Context, b *testing.B, name string) <-chan string {
			e, err := election.New(cluster.Client(b), name)
			if err != nil {
				b.Fatal(err)
			}
			values := make(chan string)
			go func() {
				defer close(values)
				for l := range e.Observe(ctx) {
					values <- l.Value
				}
			}()
			return values
		},
		keyspace: core.NamePrefix,
	},
	{
		name: "etcd",
		open: func(b *testing.B, name string) candidateAPI {
			s, err := concurrency.NewSession(cluster.Client(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return concurrency.NewElection(s, name)
		},
		observe: func(ctx context.Context, b *testing.B, name string) <-chan string {
			s, err := concurrency.NewSession(cluster.Client(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			values := make(chan string)
			go func() {
				defer close(values)
				for resp := range concurrency.NewElection(s, name).Observe(ctx) {
					values <- string(resp.Kvs[0].Value)
				}
			}()
			return values
		},
		keyspace: func(name string) string { return name + "/" },
	},
}

var benchRun atomic.Int64 // keeps names apart between runs of one benchmark

func benchName(kind string) string {
	return fmt.Sprintf("bench-%s-%d", kind, benchRun.Add(1))
}

func must(b *testing.B, err error) {
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkHandoff: the time from the leader's call to Resign to the next candidate's
// Campaign returning, the candidate having just joined the line, as under contention.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	admin := cluster.Client(b)
	type side struct {
		im     impl
		name   string
		cands  [2]candidateAPI
		leader int
		spent  time.Duration
	}
	sides := make([]*side, len(impls))
	for i, im := range impls {
		s := &side{im: im, name: benchName("handoff")}
		for j := range s.cands {
			s.cands[j] = im.open(b, s.name)
		}
		// One hand-off outside the loop grants both leases.
		must(b, s.cands[0].Campaign(ctx, "0"))
		won := make(chan error, 1)
		go func() { won <- s.cands[1].Campaign(ctx, "1") }()
		etcdtest.AwaitKeys(b, admin, im.keyspace(s.name), 2)
		must(b, s.cands[0].Resign(ctx))
		must(b, <-won)
		s.leader = 1
		sides[i] = s
	}
	b.ResetTimer()
	for range b.N {
		for _, s := range sides {
			next := s.cands[1-s.leader]
			won := make(chan time.Time, 1)
			go func() {
				if err := next.Campaign(ctx, "v"); err != nil {
					b.Error(err)
				}
				won <- time.Now()
			}()
			etcdtest.AwaitKeys(b, admin, s.im.keyspace(s.name), 2)
			resign := time.Now()
			must(b, s.cands[s.leader].Resign(ctx))
			s.spent += (<-won).Sub(resign)
			s.leader = 1 - s.leader
		}
	}
	b.StopTimer()
	for _, s := range sides {
		must(b, s.cands[s.leader].Resign(ctx))
		b.ReportMetric(float64(s.spent.Microseconds())/1000/float64(b.N), s.im.name+"-ms/handoff")
	}
	b.ReportMetric(float64(sides[1].spent)/float64(max(sides[0].spent, 1)), "speed-vs-etcd")
}

// BenchmarkObserveProclaim: the time from a Proclaim being called to an observer on
// another client receiving the value.
func BenchmarkObserveProclaim(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type side struct {
		im     impl
		leader candidateAPI
		values <-chan string
		spent  time.Duration
	}
	sides := make([]*side, len(impls))
	for i, im := range impls {
		name := benchName("observe")
		s := &side{im: im, leader: im.open(b, name)}
		must(b, s.leader.Campaign(ctx, "start"))
		s.values = im.observe(ctx, b, name)
		if v := <-s.values; v != "start" {
			b.Fatalf("%s: first observed %q", im.name, v)
		}
		sides[i] = s
	}
	b.ResetTimer()
	for i := range b.N {
		for _, s := range sides {
			v := strconv.Itoa(i)
			start := time.Now()
			must(b, s.leader.Proclaim(ctx, v))
			for got := range s.values {
				if got == v {
					break
				}
			}
			s.spent += time.Since(start)
		}
	}
	b.StopTimer()
	cancel()
	for _, s := range sides {
		for range s.values { // until Observe has closed its channel
		}
		b.ReportMetric(float64(s.spent.Microseconds())/1000/float64(b.N), s.im.name+"-ms/observed")
	}
	b.ReportMetric(float64(sides[1].spent)/float64(max(sides[0].spent, 1)), "speed-vs-etcd")
}
