package realbench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/mutex"
)

// BenchmarkLeaseEndTellsEveryHold: one client holds N names (1,000 and 10,000) on its one
// lease, every hold's Done asked for; another client revokes that lease. A run is the time
// from the revoke's answer until every hold has been told (its Done closed), reported as
// "ms-to-tell-all", with the RPCs the holding client sent meanwhile ("reads": Range, Txn
// and LeaseTimeToLive). The holds are taken and watched outside the timed part.
func BenchmarkLeaseEndTellsEveryHold(b *testing.B) {
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("holds=%d", n), func(b *testing.B) {
				var total time.Duration
				var reads int64
				for range b.N {
					d, r := tellAll(b, t, n)
					total += d
					reads += r
				}
				b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-tell-all")
				b.ReportMetric(float64(reads)/float64(b.N), "reads")
			})
		}
	})
}

func tellAll(b *testing.B, t *target, n int) (time.Duration, int64) {
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	holder, op := t.clients(b, 1, 1)[0], t.clients(b, 1, 0)[0]
	ms := make([]*mutex.Mutex, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 64)
	for i := range ms {
		m, err := mutex.New(holder.Client, fmt.Sprintf("lease-end-%d", i), mutex.WithPrefix(t.root))
		must(b, err)
		ms[i] = m
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := m.Lock(ctx); err != nil {
				errs <- err
				return
			}
			_ = m.Done()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(b, err)
	}
	resp, err := op.Get(ctx, ms[0].Key())
	must(b, err)
	if len(resp.Kvs) != 1 {
		b.Fatalf("realbench: the key of the first hold is not there")
	}
	before := holder.cnt.Counts()
	b.StartTimer()
	start := time.Now()
	_, err = op.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	must(b, err)
	revoked := time.Now()
	for _, m := range ms {
		select {
		case <-m.Done():
		case <-ctx.Done():
			b.Fatalf("realbench: a hold was not told of its lease's end")
		}
	}
	told := time.Since(revoked)
	b.StopTimer()
	sent := holder.cnt.Counts().Sub(before)
	b.Logf("%d holds: revoke took %v, every hold told %v after it; reads %v", n, revoked.Sub(start), told, sent)
	return told, sent["Range"] + sent["Txn"] + sent["LeaseTimeToLive"]
}
