package realbench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// A side is one contender of a comparison: run does its workload flat out for one round.
//
// A side with prepare does a fixed piece of work per run instead (a queue drained, say):
// runRounds calls prepare, then run, again and again until the runs' lengths add up to d, and
// the round's tally is their sum. What prepare does is outside the round: its time, its RPCs
// (run counts from its start) and its cost (observed samples around run alone).
type side struct {
	name    string
	run     func(ctx context.Context, d time.Duration) (tally, error)
	prepare func(ctx context.Context) error
}

// A tally is what a side did in one round: its counts, the first of which is the headline
// (reads beside writes), the round's length and, if measured, what it cost.
type tally struct {
	elapsed time.Duration
	counts  []count
	use     *usage // what the servers and the test process spent (see observed); nil if not measured
}

// A count is one kind of op of a round: those completed within it, all of them (also those
// under way at its end, which took the same RPCs), and the RPCs of the clients that made them.
type count struct {
	op          string // singular: "cycle", "read"
	within, all int64
	rpcs        rpcstat.Counts
}

func (t tally) rate() float64 { return t.rateOf(0) }

// plus is t and u added up as one round: their lengths, counts, RPCs and usage. The server
// figures of the sum are those of both, or missing if either's are.
func (t tally) plus(u tally) tally {
	sum := tally{elapsed: t.elapsed + u.elapsed}
	for i, c := range t.counts {
		rpcs := rpcstat.Counts{}
		rpcs.Add(c.rpcs)
		if i < len(u.counts) {
			c.within += u.counts[i].within
			c.all += u.counts[i].all
			rpcs.Add(u.counts[i].rpcs)
		}
		c.rpcs = rpcs
		sum.counts = append(sum.counts, c)
	}
	if t.use != nil && u.use != nil {
		sum.use = t.use.plus(u.use)
	}
	return sum
}

func (t tally) rateOf(i int) float64 { return float64(t.counts[i].within) / t.elapsed.Seconds() }

// A comparison is what a sub-benchmark measures: ours against a rival (etcd's own, or our
// mutex where etcd has nothing alike), and the sequential commit rate on the leader and, on
// a cluster of several, on a follower.
type comparison struct {
	ours, rival side
	commits     []side
	slack       time.Duration // how much longer than the rounds' lengths they may take, beyond 2 minutes
}

// order is the sides of round r (from 1): ours first in odd rounds, the rival first in even.
func (c comparison) order(r int) []side {
	first := []side{c.ours, c.rival}
	if r%2 == 0 {
		first = []side{c.rival, c.ours}
	}
	return append(first, c.commits...)
}

// results are the tallies of every round, by side name.
type results map[string][]tally

// runRounds runs rounds rounds of every side of c, each side for d in turn, and returns
// their tallies; it stops at the first error.
func runRounds(ctx context.Context, c comparison, rounds int, d time.Duration) (results, error) {
	res := results{}
	for r := 1; r <= rounds; r++ {
		for _, s := range c.order(r) {
			t, err := runSide(ctx, s, d)
			if err != nil {
				return res, fmt.Errorf("round %d, %s: %w", r, s.name, err)
			}
			res[s.name] = append(res[s.name], t)
		}
	}
	return res, nil
}

// runSide runs one round of s: its run once, or, for a side with prepare, prepare and run
// until the runs add up to d.
func runSide(ctx context.Context, s side, d time.Duration) (tally, error) {
	if s.prepare == nil {
		return s.run(ctx, d)
	}
	var sum tally
	for runs := 0; sum.elapsed < d; runs++ {
		if err := s.prepare(ctx); err != nil {
			return sum, fmt.Errorf("prepare: %w", err)
		}
		t, err := s.run(ctx, d)
		if runs == 0 {
			sum = t
		} else {
			sum = sum.plus(t)
		}
		if err != nil {
			return sum, err
		}
		if t.elapsed <= 0 {
			return sum, errors.New("a run took no time")
		}
	}
	return sum, nil
}

// summary is the median, the lowest and the highest of some rates.
type summary struct{ median, low, high float64 }

func summarise(rates []float64) summary {
	s := slices.Clone(rates)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return summary{}
	}
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return summary{med, s[0], s[n-1]}
}

// rates lists the rate of count i of each round.
func rates(ts []tally, i int) []float64 {
	out := make([]float64, len(ts))
	for r, t := range ts {
		out[r] = t.rateOf(i)
	}
	return out
}

// ratios lists, round by round, the headline rate of a over that of b.
func ratios(a, b []tally) []float64 {
	out := make([]float64, min(len(a), len(b)))
	for r := range out {
		out[r] = a[r].rate() / b[r].rate()
	}
	return out
}

// keepAlives are the messages on lease keep-alive streams, left out of the RPCs per op: they
// go per lease and per third of its TTL, not per op.
const keepAlives = "LeaseKeepAlive.send"

// report reports the results of c as metrics of b and logs them in one line; about is
// what the line starts with (the cluster). The metrics:
//
//   - "<side>-<op>s/s": the median over rounds of each side's ops completed per second
//     ("ours", the rival, "leader"/"follower" for the sequential commits); "<side>-min-" and
//     "<side>-max-" the lowest and highest round.
//   - "ours/<rival>": the median over rounds of ours over the rival's headline rate in the
//     same round; "ours/commit" of ours over the leader's commits in the same round.
//   - "<side>-<Method>/<op>": the calls of ours and the rival per op by gRPC method, over all
//     rounds (a "Watch" is a watch stream opened, "Watch.send" a watch created or cancelled
//     on one, "LeaseKeepAlive" a keep-alive stream opened; keep-alive messages are not
//     counted).
//   - "<side>-syncs/<op>", "<side>-sync-ms/sync", "<side>-proposals/<op>",
//     "<side>-etcdCPU-ms/<op>", "<side>-leaderCPU-ms/<op>", "<side>-clientCPU-ms/<op>": what
//     every side's headline op cost the leader, the members and the test process (doc.go,
//     usePerOp); the server figures only if the members' /metrics could be read, else the
//     line says why.
func report(b *testing.B, about string, c comparison, res results) {
	var line strings.Builder
	line.WriteString(about)
	sides := append([]side{c.ours, c.rival}, c.commits...)
	for _, s := range sides {
		ts := res[s.name]
		if len(ts) == 0 {
			continue
		}
		for i, cn := range ts[0].counts {
			sum := summarise(rates(ts, i))
			unit := cn.op + "s/s"
			b.ReportMetric(sum.median, s.name+"-"+unit)
			b.ReportMetric(sum.low, s.name+"-min-"+unit)
			b.ReportMetric(sum.high, s.name+"-max-"+unit)
			fmt.Fprintf(&line, "; %s %s %s", s.name, unit, formatRates(rates(ts, i)))
		}
	}
	ours, rival := res[c.ours.name], res[c.rival.name]
	vsRival := summarise(ratios(ours, rival))
	b.ReportMetric(vsRival.median, c.ours.name+"/"+c.rival.name)
	fmt.Fprintf(&line, "; %s/%s %.3g", c.ours.name, c.rival.name, vsRival.median)
	if len(c.commits) > 0 {
		vsCommit := summarise(ratios(ours, res[c.commits[0].name]))
		b.ReportMetric(vsCommit.median, c.ours.name+"/commit")
		fmt.Fprintf(&line, ", %s/commit %.3g", c.ours.name, vsCommit.median)
	}
	for _, s := range []side{c.ours, c.rival} {
		line.WriteString(";")
		for i, per := range rpcsPerOp(res[s.name]) {
			op := res[s.name][0].counts[i].op
			for _, m := range slices.Sorted(maps.Keys(per)) {
				v := per[m]
				b.ReportMetric(v, s.name+"-"+m+"/"+op)
				fmt.Fprintf(&line, " %s-%s/%s %.3g", s.name, m, op, v)
			}
		}
	}
	missing, rounds := 0, 0
	var why error
	for _, s := range sides {
		reportUsage(b, &line, s.name, res[s.name])
		n, err := usageErr(res[s.name])
		missing, rounds = missing+n, rounds+len(res[s.name])
		if why == nil {
			why = err
		}
	}
	if missing > 0 {
		fmt.Fprintf(&line, "; server metrics not read in %d of %d rounds of a side, left out (%v)", missing, rounds, why)
	}
	b.Log(line.String())
}

// rpcsPerOp returns, for each count of the tallies, its calls by method per op over all
// rounds, keep-alive messages left out.
func rpcsPerOp(ts []tally) []map[string]float64 {
	if len(ts) == 0 {
		return nil
	}
	out := make([]map[string]float64, len(ts[0].counts))
	for i := range out {
		calls, ops := rpcstat.Counts{}, int64(0)
		for _, t := range ts {
			calls.Add(t.counts[i].rpcs)
			ops += t.counts[i].all
		}
		delete(calls, keepAlives)
		out[i] = map[string]float64{}
		if ops == 0 {
			continue
		}
		for m, n := range calls {
			out[i][m] = float64(n) / float64(ops)
		}
	}
	return out
}

func formatRates(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strings.Join(parts, " ")
}

// window is one round of a side: it ends d after it opens.
type window struct {
	start   time.Time
	elapsed time.Duration // from the start to the end, set before over closes
	over    chan struct{} // closed at the end
	done    atomic.Bool   // set at the end: cheaper to poll than over
}

func openWindow(d time.Duration) *window {
	w := &window{over: make(chan struct{}), start: time.Now()}
	time.AfterFunc(d, func() {
		w.elapsed = time.Since(w.start)
		w.done.Store(true)
		close(w.over)
	})
	return w
}

func (w *window) ended() bool { return w.done.Load() }

// length waits for the end and returns the window's length.
func (w *window) length() time.Duration {
	<-w.over
	return w.elapsed
}

// measured counts the ops of one goroutine: within the window, and in all.
type measured struct{ within, all int64 }

func (m *measured) add(w *window) {
	m.all++
	if !w.ended() {
		m.within++
	}
}

// loop runs each of workers on a goroutine of its own, over and over until w ends, and
// returns how many runs completed; a worker that fails stops, and its error is returned
// once all have stopped. A worker's run takes and gives back whatever it holds, so that
// the others can finish theirs after the end.
func loop(ctx context.Context, w *window, workers []func(context.Context) error) (measured, error) {
	counts, errs := make([]measured, len(workers)), make([]error, len(workers))
	var wg sync.WaitGroup
	for i, work := range workers {
		wg.Go(func() {
			var m measured // kept here: neighbours in counts would share a cache line
			defer func() { counts[i] = m }()
			for !w.ended() {
				if err := work(ctx); err != nil {
					errs[i] = fmt.Errorf("worker %d: %w", i, err)
					return
				}
				m.add(w)
			}
		})
	}
	wg.Wait()
	var sum measured
	for _, m := range counts {
		sum.within += m.within
		sum.all += m.all
	}
	return sum, errors.Join(errs...)
}

// loopSide is a side whose workers loop (see loop) on clients, an op of kind op per run.
func loopSide(name, op string, clients []counted, workers []func(context.Context) error) side {
	return side{name: name, run: func(ctx context.Context, d time.Duration) (tally, error) {
		before := countsOf(clients)
		w := openWindow(d)
		m, err := loop(ctx, w, workers)
		elapsed := w.length()
		return tally{elapsed, []count{{op, m.within, m.all, countsOf(clients).Sub(before)}}, nil}, err
	}}
}

// settings are the rounds and their length: 3 of 2 s, or ETCDSYNC_BENCH_ROUNDS and
// ETCDSYNC_BENCH_ROUND.
func settings(b *testing.B) (rounds int, d time.Duration) {
	rounds, d = 3, 2*time.Second
	if s := os.Getenv("ETCDSYNC_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("ETCDSYNC_BENCH_ROUNDS=%q: want a count of at least 1", s)
		}
		rounds = n
	}
	if s := os.Getenv("ETCDSYNC_BENCH_ROUND"); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil || v <= 0 {
			b.Fatalf("ETCDSYNC_BENCH_ROUND=%q: want a duration such as 2s", s)
		}
		d = v
	}
	return rounds, d
}
