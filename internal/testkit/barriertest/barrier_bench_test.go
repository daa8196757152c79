package barrier_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// A doubleBarrier is ours or etcd's recipe.DoubleBarrier: enter, then leave.
type doubleBarrier interface {
	Enter(ctx context.Context) error
	Leave(ctx context.Context) error
}

// etcdBarrier is etcd's double barrier, which takes no ctx (its session's is used), on a
// name of its own per round: it cannot be entered again while a round leaves (its ready key
// may still be there, and its count of waiters is of every round at once, #14603).
type etcdBarrier struct {
	s     *concurrency.Session
	n     int
	name  func() string
	round *recipe.DoubleBarrier
}

func (e *etcdBarrier) Enter(context.Context) error {
	e.round = recipe.NewDoubleBarrier(e.s, e.name(), e.n)
	return e.round.Enter()
}

func (e *etcdBarrier) Leave(context.Context) error { return e.round.Leave() }

// BenchmarkDoubleBarrier: n participants, each on a counted client of its own, go through
// one round of a double barrier per op, all entering at once and then all leaving: ours on
// one name round after round, and etcd's recipe.DoubleBarrier (a name per round). It reports
// the RPCs and watch events of all participants together per round.
func BenchmarkDoubleBarrier(b *testing.B) {
	for _, n := range []int{4, 16} {
		for _, impl := range []string{"ours", "etcd"} {
			b.Run(fmt.Sprintf("n=%d/%s", n, impl), func(b *testing.B) {
				ctx := context.Background()
				name := fmt.Sprintf("bench-%s-%d-%d", impl, n, b.N)
				fresh(b, name)
				parts := make([]doubleBarrier, n)
				counters := make([]*rpcstat.Counter, n)
				var round int
				for i := range parts {
					counters[i] = &rpcstat.Counter{}
					cli := primtest.CountedClient(b, cluster, counters[i])
					if impl == "ours" {
						p, err := barrier.New(cli, name, n)
						if err != nil {
							b.Fatal(err)
						}
						parts[i] = p
						continue
					}
					s, err := concurrency.NewSession(cli)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { s.Close() })
					parts[i] = &etcdBarrier{s: s, n: n, name: func() string { return fmt.Sprintf("%s/%d", name, round) }}
				}
				runRound := func() {
					var wg sync.WaitGroup
					errs := make([]error, n)
					for i, p := range parts {
						wg.Go(func() {
							if errs[i] = p.Enter(ctx); errs[i] == nil {
								errs[i] = p.Leave(ctx)
							}
						})
					}
					wg.Wait()
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
					round++
				}
				runRound() // leases granted, names' records written: outside the measure
				before := make([]rpcstat.Counts, n)
				for i, c := range counters {
					before[i] = c.Counts()
				}
				b.ResetTimer()
				for range b.N {
					runRound()
				}
				b.StopTimer()
				total := rpcstat.Counts{}
				for i, c := range counters {
					total.Add(c.Counts().Sub(before[i]))
				}
				for _, m := range total.Methods() {
					b.ReportMetric(float64(total[m])/float64(b.N), m+"/round")
				}
				_, err := cluster.Client(b).Delete(ctx, name, clientv3.WithPrefix())
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
