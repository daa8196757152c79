package realbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// BenchmarkRevokeStall: how long the end of one client's leases stalls every other write on
// the cluster when that client holds many locks. A holder, one client on member 0, takes N
// holds (ETCDSYNC_BENCH_HOLDS, 100,000 by default) with a Mutex's TryLock on N names,
// stallTakers at a time, all bound to the lease(s) its primitives share for their TTL. A
// writer, one client pinned to the leader, then Puts one key after another; after
// stallBaseline of it, the holder's leases end, in one of two ways, a sub-benchmark each:
//
//   - "end=shutdown": mutex.Shutdown on the holder's client revokes them (TTL DefaultTTL), as
//     a process does on its way out.
//   - "end=expiry": the holder's client closes without a Shutdown, as a process that crashed:
//     nothing renews its leases (TTL stallExpiryTTL, or ETCDSYNC_BENCH_STALL_TTL) and etcd
//     lets them expire.
//
// The end runs from the Shutdown call (the Close) until a count of the holds' keys, read
// every stallPoll from a third client on the leader, finds none; that must happen within
// stallGoneWithin. The writer goes on stallAfter beyond it, then stops. The metrics:
//
//   - "holds": N; "leases": the distinct leases that the N keys were on, read just before the
//     end.
//   - "p50-put-ms", "base-max-put-ms": the median and the highest latency of the writer's Puts
//     completed before the end began (the baseline).
//   - "max-put-ms": the highest latency of a Put under way at any moment of the end: the
//     stall.
//   - "max-gap-ms": the longest time between two consecutive completions of the writer's
//     Puts, over all of its run.
//   - "gone-ms": from the start of the end until the count found no key, to within stallPoll
//     (for "end=expiry" it includes what was left of the TTL since the last renewal);
//     "shutdown-ms": how long the Shutdown call took ("end=shutdown" only).
//
// Each sub-benchmark also logs a line with them, how long taking the holds took, and the
// writer's Puts before and during the end. One b.N iteration is one trial, holds and all, so
// b.N stays 1 with the default -benchtime and ns/op (taking the holds included) says little:
// read the metrics, which are the mean over the trials when there are several. The keys are
// under the sub-benchmark's root (see newTarget): the holds' under "stall-<end>-<i>", the
// writer's "stall-probe"; every key under "stall-" is deleted when the sub-benchmark ends.
//
// ETCDSYNC_BENCH_LEASE_KEYS, if set, is the most keys a shared lease carries (the library's
// bound otherwise), for a run as before that bound: one lease for every hold.
func BenchmarkRevokeStall(b *testing.B) {
	n := stallHoldCount(b)
	if s := os.Getenv("ETCDSYNC_BENCH_LEASE_KEYS"); s != "" {
		k, err := strconv.Atoi(s)
		if err != nil || k < 1 {
			b.Fatalf("ETCDSYNC_BENCH_LEASE_KEYS=%q: not a count", s)
		}
		defer core.SetMaxLeaseKeys(k)()
	}
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, end := range []string{stallShutdown, stallExpiry} {
			b.Run("end="+end, func(b *testing.B) { benchStall(b, t, end, n) })
		}
	})
}

const (
	stallShutdown = "shutdown" // the leases end with mutex.Shutdown
	stallExpiry   = "expiry"   // the leases end when nobody renews them

	stallPrefix     = "stall-"        // the names of the holds and the writer's key, under the root
	stallHolds      = 100000          // N without ETCDSYNC_BENCH_HOLDS
	stallTakers     = 64              // TryLocks under way at once while the holds are taken
	stallExpiryTTL  = 5 * time.Second // the holds' TTL for "end=expiry"
	stallBaseline   = time.Second     // the writer's run before the end
	stallAfter      = 2 * time.Second // the writer's run after the keys are gone
	stallPoll       = 100 * time.Millisecond
	stallGoneWithin = 3 * time.Minute // the longest the keys may take to go once the end began
)

// stallHoldCount is N: 100,000, or ETCDSYNC_BENCH_HOLDS.
func stallHoldCount(b *testing.B) int {
	s := os.Getenv("ETCDSYNC_BENCH_HOLDS")
	if s == "" {
		return stallHolds
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("ETCDSYNC_BENCH_HOLDS=%q: want a count of at least 1", s)
	}
	return n
}

func benchStall(b *testing.B, t *target, end string, n int) {
	keys := t.root + stallPrefix
	cfg := plainConfig(t.cluster, t.cluster.Endpoints())
	b.Cleanup(func() { // registered first, so it runs after every client has closed
		if _, err := etcdtest.DeletePrefix(cfg, keys); err != nil {
			b.Errorf("realbench: delete %s: %v", keys, err)
		}
	})
	writer, reader := t.clients(b, 1, t.leader)[0], t.clients(b, 1, t.leader)[0]
	probeKey := keys + "probe"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := writer.Put(ctx, probeKey, "x") // the writer's connection is up before the trial
	cancel()
	must(b, err)
	var sum stallTrial
	b.ResetTimer()
	for range b.N {
		r := runStall(b, t, end, n, writer.Client, reader.Client, probeKey)
		b.Log(r.line(t, end))
		sum.add(r)
	}
	b.StopTimer()
	mean := func(d time.Duration) float64 { return ms(d) / float64(b.N) }
	b.ReportMetric(float64(sum.holds)/float64(b.N), "holds")
	b.ReportMetric(float64(sum.leases)/float64(b.N), "leases")
	b.ReportMetric(mean(sum.p50), "p50-put-ms")
	b.ReportMetric(mean(sum.baseMax), "base-max-put-ms")
	b.ReportMetric(mean(sum.maxPut), "max-put-ms")
	b.ReportMetric(mean(sum.maxGap), "max-gap-ms")
	b.ReportMetric(mean(sum.gone), "gone-ms")
	if end == stallShutdown {
		b.ReportMetric(mean(sum.shutdown), "shutdown-ms")
	}
}

// A stallTrial is what one trial of BenchmarkRevokeStall measured.
type stallTrial struct {
	holds, leases int
	took          time.Duration // taking the holds
	shutdown      time.Duration // the Shutdown call, for "end=shutdown"
	gone          time.Duration // from the start of the end until no key was left
	basePuts      int           // the writer's Puts completed before the end
	p50, baseMax  time.Duration // their median and highest latency
	endPuts       int           // its Puts under way at some moment of the end
	maxPut        time.Duration // their highest latency
	maxGap        time.Duration // the longest time between two completions, over the writer's run
}

func (s *stallTrial) add(r stallTrial) {
	s.holds += r.holds
	s.leases += r.leases
	s.took += r.took
	s.shutdown += r.shutdown
	s.gone += r.gone
	s.basePuts += r.basePuts
	s.p50 += r.p50
	s.baseMax += r.baseMax
	s.endPuts += r.endPuts
	s.maxPut += r.maxPut
	s.maxGap += r.maxGap
}

func (r stallTrial) line(t *target, end string) string {
	how := "the holder's client closed"
	if end == stallShutdown {
		how = fmt.Sprintf("Shutdown took %.3g ms", ms(r.shutdown))
	}
	return fmt.Sprintf("members=%d, leader m%d, holder on m0, writer on m%d: %d holds on %d leases, taken in %.3g s; "+
		"%s, keys gone %.4g ms after the end began; writer: before the end %d Puts, p50 %.3g ms, max %.3g ms; "+
		"during the end %d Puts, max %.3g ms; longest gap between Puts %.3g ms",
		t.cluster.Size(), t.leader, t.leader, r.holds, r.leases, r.took.Seconds(),
		how, ms(r.gone), r.basePuts, ms(r.p50), ms(r.baseMax),
		r.endPuts, ms(r.maxPut), ms(r.maxGap))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// runStall runs one trial: a new holder takes n holds, the writer Puts probeKey through the
// end of the holder's leases, reader counts the keys.
func runStall(b *testing.B, t *target, end string, n int, writer, reader *clientv3.Client, probeKey string) stallTrial {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(n)*time.Millisecond)
	defer cancel()
	ttl := mutex.DefaultTTL
	var holder counted
	if end == stallExpiry {
		ttl = stallExpiryTTL
		if v := os.Getenv("ETCDSYNC_BENCH_STALL_TTL"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second {
				b.Fatalf("ETCDSYNC_BENCH_STALL_TTL=%q: not a TTL of 1s or more", v)
			}
			ttl = d
		}
		holder = t.clients(b, 1, 0)[0] // closed in the trial, never shut down
	} else {
		holder = t.oursClients(b, 1)[0] // shut down when b ends too: after a failure
	}
	prefix := t.root + stallPrefix + end + "-" // the names' keys, "<name>/<lease>_<slot>"
	start := time.Now()
	locks, err := takeHolds(ctx, holder.Client, t.root, stallPrefix+end+"-", n, ttl)
	must(b, err)
	r := stallTrial{holds: n, took: time.Since(start)}
	r.leases, err = leasesUnder(ctx, reader, prefix, n)
	must(b, err)

	w := startProbe(ctx, writer, probeKey)
	time.Sleep(stallBaseline)
	began := time.Now()
	if end == stallShutdown {
		err = mutex.Shutdown(ctx, holder.Client)
		r.shutdown = time.Since(began)
	} else {
		err = holder.Close()
	}
	var goneAt time.Time
	if err == nil {
		goneAt, err = awaitGone(ctx, reader, prefix)
	}
	if err != nil {
		_, _ = w.stop()
		b.Fatalf("end=%s: %v", end, err)
	}
	r.gone = goneAt.Sub(began)
	time.Sleep(stallAfter)
	puts, err := w.stop()
	must(b, err)
	runtime.KeepAlive(locks)

	var base []float64
	for i, p := range puts {
		lat := p.done.Sub(p.start)
		if p.done.Before(began) {
			base = append(base, ms(lat))
			r.baseMax = max(r.baseMax, lat)
		} else if p.start.Before(goneAt) {
			r.endPuts++
			r.maxPut = max(r.maxPut, lat)
		}
		if i > 0 {
			r.maxGap = max(r.maxGap, p.done.Sub(puts[i-1].done))
		}
	}
	if len(base) == 0 {
		b.Fatalf("end=%s: no Put of the writer completed in the %v before the end", end, stallBaseline)
	}
	r.basePuts = len(base)
	r.p50 = time.Duration(summarise(base).median * float64(time.Millisecond))
	return r
}

// takeHolds takes n holds on cli with TryLock, on the names name0 ... name<n-1> under root,
// with the TTL ttl, stallTakers at a time. It stops at the first failure.
func takeHolds(ctx context.Context, cli *clientv3.Client, root, name string, n int, ttl time.Duration) ([]*mutex.Mutex, error) {
	locks := make([]*mutex.Mutex, n)
	errs := make([]error, stallTakers)
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for g := range stallTakers {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				m, err := mutex.New(cli, name+strconv.Itoa(i), mutex.WithPrefix(root), mutex.WithTTL(ttl))
				if err == nil {
					err = m.TryLock(ctx)
				}
				if err != nil {
					errs[g] = fmt.Errorf("hold %d of %d: %w", i, n, err)
					failed.Store(true)
					return
				}
				locks[i] = m
			}
		})
	}
	wg.Wait()
	return locks, errors.Join(errs...)
}

// leasesUnder reads the keys under prefix, which must be want, and returns how many
// distinct leases they are on.
func leasesUnder(ctx context.Context, cli *clientv3.Client, prefix string, want int) (int, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("read the keys under %q: %w", prefix, err)
	}
	if len(resp.Kvs) != want {
		return 0, fmt.Errorf("%d keys under %q, want one per hold: %d", len(resp.Kvs), prefix, want)
	}
	leases := map[int64]bool{}
	for _, kv := range resp.Kvs {
		leases[kv.Lease] = true
	}
	return len(leases), nil
}

// awaitGone counts the keys under prefix every stallPoll until there are none, and returns
// when the count that found none came back; it fails after stallGoneWithin.
func awaitGone(ctx context.Context, cli *clientv3.Client, prefix string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, stallGoneWithin)
	defer cancel()
	tick := time.NewTicker(stallPoll)
	defer tick.Stop()
	for {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return time.Time{}, fmt.Errorf("count the keys under %q: %w", prefix, err)
		}
		if resp.Count == 0 {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d keys still under %q %v after the end began", resp.Count, prefix, stallGoneWithin)
		case <-tick.C:
		}
	}
}

// A put is one of the writer's Puts: when it was sent and when its answer came.
type put struct{ start, done time.Time }

// A probe is the writer of BenchmarkRevokeStall: one Put after another on one key, until
// stop.
type probe struct {
	stopped atomic.Bool
	exited  chan struct{}
	puts    []put
	err     error
}

func startProbe(ctx context.Context, cli *clientv3.Client, key string) *probe {
	p := &probe{exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		for !p.stopped.Load() {
			start := time.Now()
			if _, err := cli.Put(ctx, key, "x"); err != nil {
				p.err = fmt.Errorf("writer: Put: %w", err)
				return
			}
			p.puts = append(p.puts, put{start, time.Now()})
		}
	}()
	return p
}

// stop stops the writer once its Put under way is answered, and returns its Puts in order.
func (p *probe) stop() ([]put, error) {
	p.stopped.Store(true)
	<-p.exited
	return p.puts, p.err
}
