package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The environment variables of Explore: ExploreEnv draws new seeds for a duration ("10m"),
// SeedEnv replays one seed.
const (
	ExploreEnv = "ETCDSYNC_EXPLORE"
	SeedEnv    = "ETCDSYNC_SEED"
)

// ciSeeds are the seeds Explore may run without ExploreEnv: a fixed set, so that what a
// run draws is the same every time (what the timing makes of it still varies). A workload
// runs the one its Seed picks, to keep the test command within its time on 2 cores; the
// primitives pick different ones, so that CI still meets all of them, and any other is one
// SeedEnv away.
var ciSeeds = []uint64{1, 2, 3}

const (
	exploreClients   = 3                // clients of one seed, each with its own proxies and injector
	handlesPerClient = 2                // workers per client on the shared name: one lease, several holds and waiters
	exploreFor       = 8 * time.Second  // how long a seed draws faults
	sideProgress     = 5 * time.Second  // how long a healthy client's own lock may go without progress while another client is cut off
	sideRecovery     = 20 * time.Second // how long a client's own lock may take to go on after earlier faults
)

// Explore runs w under schedules drawn from seeds instead of one fault at a time: several
// clients with several handles each (one lease carries several holds and waiters), workers
// that lock, try, cancel at random moments, ask Done and Err, write under their holds and
// release (or do that through Do, or through an election's Run, term after term), and
// between them faults drawn from the seed: leases revoked, a name's keys deleted by an
// operator, clients cut off beside healthy ones, answers that come late or never, requests
// applied after the client gave up, renewals without an answer, Shutdown, compaction,
// members partitioned or stopped. Each seed is checked as Suite checks a fault
// (the fenced register, exclusion, linearizability, liveness once everything healed, no key
// left), and also that a cut-off client never holds up the locks of the others, and that
// no goroutine of the primitives outlives the seed's clients.
//
// A failure names its seed; SeedEnv=N replays it (the same draws; the timing differs).
// Each seed runs on a 3-member cluster, and again on one with auth on (JWTs). Without
// ExploreEnv it runs the one of ciSeeds that w.Seed picks, on one of the two (ciKind);
// with ExploreEnv=10m it draws new seeds for ten minutes. It skips in -short mode.
func Explore(t *testing.T, w Workload) {
	if testing.Short() {
		t.Skip("the explorer starts a 3-member cluster and takes a minute")
	}
	seeds, err := exploreSeeds(w.Seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(approachOften())
	es := &envs{t: t}
	kinds := []struct {
		suffix string
		auth   bool
	}{{"", false}, {"-auth", true}}
	if ciRun() {
		kinds = kinds[ciKind(w.Seed):][:1] // the fixed seeds: one kind per workload
	}
	var total exploreStats
	for seed := range seeds {
		failed := false
		for _, e := range kinds {
			env := es.get(e.auth)
			var st exploreStats
			ok := t.Run(fmt.Sprintf("seed-%d%s", seed, e.suffix), func(t *testing.T) {
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("replay with %s=%d", SeedEnv, seed)
					}
				})
				st = exploreSeed(t, env, w, seed)
			})
			if leaked := ownGoroutines(10 * time.Second); leaked != "" {
				t.Errorf("seed %d%s: goroutines of the primitives outlived its clients:\n%s", seed, e.suffix, leaked)
			}
			total.add(st)
			failed = failed || !ok
		}
		if failed && os.Getenv(ExploreEnv) == "" {
			break // the fixed seeds: one failure is enough to look at
		}
	}
	t.Logf("explored %s", total)
}

// ciRun reports whether Explore runs CI's fixed seeds: neither ExploreEnv nor SeedEnv set.
func ciRun() bool { return os.Getenv(ExploreEnv) == "" && os.Getenv(SeedEnv) == "" }

// ciKind is the kind of cluster (0 plain, 1 with auth) CI's fixed seed of a workload runs
// on, to keep the test command within its time on 2 cores: seed 1 (rwmutex, election) with
// auth, the others without, whose draws include members stopped and majorities down, which
// a cluster with auth does not draw. Any other kind is SeedEnv away: it runs both.
func ciKind(seed uint64) int {
	if seed == 1 {
		return 1
	}
	return 0
}

// exploreSeeds yields the seeds to run: SeedEnv's, the one of ciSeeds that pick names (its
// last, for 0 or one outside them), or new ones until ExploreEnv's duration has passed.
func exploreSeeds(pick uint64) (func(yield func(uint64) bool), error) {
	if v := os.Getenv(SeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("faulttest: %s=%q is not a seed", SeedEnv, v)
		}
		return slices.Values([]uint64{seed}), nil
	}
	v := os.Getenv(ExploreEnv)
	if v == "" {
		seed := ciSeeds[len(ciSeeds)-1]
		if slices.Contains(ciSeeds, pick) {
			seed = pick
		}
		return slices.Values([]uint64{seed}), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("faulttest: %s=%q is not a positive duration", ExploreEnv, v)
	}
	deadline := time.Now().Add(d)
	return func(yield func(uint64) bool) {
		for time.Now().Before(deadline) {
			if !yield(rand.Uint64() % 1_000_000_000) {
				return
			}
		}
	}, nil
}

// exploreStats counts what the explorer covered.
type exploreStats struct {
	schedules, holds, failedLocks int
	scoped                        int // of the holds, those taken through Do or Run
	changed                       int // downgrades and upgrades made (rwmutex)
	faults                        map[string]int
}

func (s *exploreStats) add(o exploreStats) {
	s.schedules += o.schedules
	s.holds += o.holds
	s.scoped += o.scoped
	s.changed += o.changed
	s.failedLocks += o.failedLocks
	for k, v := range o.faults {
		if s.faults == nil {
			s.faults = map[string]int{}
		}
		s.faults[k] += v
	}
}

func (s exploreStats) String() string {
	var names []string
	n := 0
	for k, v := range s.faults {
		names = append(names, fmt.Sprintf("%s %d", k, v))
		n += v
	}
	slices.Sort(names)
	changed := ""
	if s.changed > 0 {
		changed = fmt.Sprintf(", %d changed in place", s.changed)
	}
	return fmt.Sprintf("%d schedules, %d holds (%d through Do or Run%s), %d failed or cancelled acquisitions, %d faults (%s)",
		s.schedules, s.holds, s.scoped, changed, s.failedLocks, n, strings.Join(names, ", "))
}

// exploration is one seed's run: the workload, its clients, and the side workers that lock
// names of their own client's.
type exploration struct {
	t       testing.TB
	r       *Run
	rng     *rand.Rand // the fault schedule's; each worker has its own
	clients []*Client
	side    []*sideWorker
	faults  map[string]int
}

func exploreSeed(t *testing.T, env *Env, w Workload, seed uint64) exploreStats {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A name of its own per seed and run, so that a run against a cluster that kept keys of
	// an earlier one is not disturbed by them.
	name := fmt.Sprintf("explore-%d-%x", seed, time.Now().UnixNano()&0xffffff)
	x := &exploration{t: t, rng: rand.New(rand.NewPCG(seed, 0x5eed)), faults: map[string]int{}}
	x.r = env.newRun(t, w, name)
	for i := range exploreClients {
		cli := env.workerClient(t, i)
		x.clients = append(x.clients, cli)
		for range handlesPerClient {
			x.r.addWorker(t, cli)
		}
		x.side = append(x.side, x.newSideWorker(t, cli, fmt.Sprintf("%s-own-%d", name, i)))
	}
	var observers []func(context.Context) error
	if w.Observe != nil {
		for i := range env.Cluster.Size() {
			observers = append(observers, w.Observe(ctx, env.SpreadClient(t, i).Client, name))
		}
	}
	x.r.launch(t, func(ctx context.Context, wk *worker) {
		x.r.exploreWork(ctx, wk, rand.New(rand.NewPCG(seed, uint64(wk.id))))
	})
	for _, s := range x.side {
		x.r.wg.Go(func() { s.run(x.r) })
	}
	if _, err := x.r.hist.awaitAcquires(ctx, warmUp, 0, -1); err != nil {
		t.Fatalf("no warm-up: %v", err)
	}

	for start := time.Now(); time.Since(start) < exploreFor; {
		f := x.drawFault()
		x.faults[f.name]++
		at := x.r.hist.Now()
		detail, err := f.apply(ctx, x)
		if err != nil {
			t.Errorf("fault %s: %v", f.name, err)
		}
		t.Logf("[%v, %v] %s %s", at, x.r.hist.Now(), f.name, detail)
		x.r.wait(time.Duration(50+x.rng.IntN(700)) * time.Millisecond)
	}
	x.healAll(ctx)
	healed := x.r.hist.Now()

	bound := w.serveBound()
	sctx, scancel := context.WithTimeout(ctx, bound)
	served, err := x.r.hist.awaitAcquires(sctx, 1, healed, -1)
	scancel()
	if err != nil {
		t.Errorf("liveness: no worker served within %v after every fault healed: %v%s", bound, err, dumpGoroutines(t.ArtifactDir()))
	} else if _, err := x.r.hist.awaitAcquires(ctx, settleShort, served, -1); err != nil {
		t.Errorf("liveness: the workload did not go on after every fault healed: %v", err)
	}
	x.r.Stop()
	for i, converged := range observers {
		cctx, cancel := context.WithTimeout(ctx, bound)
		if err := converged(cctx); err != nil {
			t.Errorf("observer %d: %v", i, err)
		}
		cancel()
	}
	x.r.Check(t)
	for _, s := range x.side {
		for _, prefix := range append([]string{w.Prefix(s.name)}, w.partnerPrefixes(s.name)...) {
			if v := x.r.awaitEmpty(ctx, prefix); v != "" {
				t.Error(v)
			}
		}
	}
	ops := x.r.hist.Ops()
	st := exploreStats{schedules: 1, failedLocks: len(x.r.hist.FailedLocks()), scoped: int(x.r.scoped.Load()), changed: int(x.r.changed.Load()), faults: x.faults}
	for _, op := range ops {
		if op.Kind == Acquire || op.Kind == ReadAcquire {
			st.holds++
		}
	}
	t.Logf("seed %d: %s", seed, st)
	return st
}

// tryLocker is a Locker whose handle can also try without waiting.
type tryLocker interface {
	TryLock(ctx context.Context) error
}

// doner is a Locker whose hold reports its end.
type doner interface {
	Done() <-chan struct{}
	Err() error
}

// exploreWork is a worker of the explorer: cycles of an acquisition drawn from rng (a try, a
// Lock that is cancelled at a random moment, or one that may wait), Done and Err now and
// then, fenced writes, and a release, until Stop. A quarter of the cycles of a Locker that
// has Do go through it, and a quarter of those of an election through Run (see scoped.go);
// a fifth of an rwmutex's are upgradable reads, and a quarter of its write holds end by a
// downgrade (see change.go).
func (r *Run) exploreWork(ctx context.Context, wk *worker, rng *rand.Rand) {
	for !r.stopped() {
		call := r.hist.Now()
		if d, ok := wk.lk.(doer); ok && rng.IntN(4) == 0 {
			r.exploreDo(ctx, wk, d, rng, call)
			continue
		}
		if l, ok := wk.lk.(leaderLoop); ok && rng.IntN(4) == 0 {
			r.exploreRun(ctx, wk, l, rng, call)
			continue
		}
		if c, ok := wk.lk.(changer); ok && rng.IntN(5) == 0 {
			r.exploreUpgrade(ctx, wk, c, rng, call)
			continue
		}
		var err error
		tl, canTry := wk.lk.(tryLocker)
		switch d := rng.IntN(10); {
		case d < 2 && canTry:
			tctx, cancel := context.WithTimeout(ctx, lockTimeout)
			err = tl.TryLock(tctx)
			cancel()
			if core.Busy(err) {
				r.wait(time.Duration(rng.IntN(30)) * time.Millisecond)
				continue
			}
		case d < 5:
			// Cancelled at a random moment: queued, being served, or not yet sent.
			cctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(400))*time.Millisecond)
			err = wk.lk.Lock(cctx)
			cancel()
		default:
			lctx, cancel := context.WithTimeout(ctx, lockTimeout)
			err = wk.lk.Lock(lctx)
			cancel()
		}
		if err != nil {
			r.hist.lockFailed(wk.id, Acquire, call, err)
			r.wait(time.Duration(rng.IntN(50)) * time.Millisecond)
			continue
		}
		token := wk.lk.Token()
		r.hist.add(Op{Worker: wk.id, Kind: Acquire, Token: token, Units: unitsOf(wk.lk), Call: call, Return: r.hist.Now()})
		if d, ok := wk.lk.(doner); ok && rng.IntN(2) == 0 {
			_ = d.Done() // starts the hold's watch
			_ = d.Err()
		}
		r.writeUnderHold(wk, token)
		if c, ok := wk.lk.(changer); ok && rng.IntN(4) == 0 {
			r.exploreDowngrade(wk, c, token, rng)
			continue
		}
		if rng.IntN(3) == 0 {
			r.wait(time.Duration(rng.IntN(50)) * time.Millisecond)
		}
		r.release(wk, token)
	}
}

// A sideWorker locks a name of its own client's alone, over and over: its progress while
// another client is cut off shows that the cut-off client holds up nobody else.
type sideWorker struct {
	name string
	cli  *Client
	lk   Locker
	open func() (Locker, error)

	mu       sync.Mutex
	acquires int
	changed  chan struct{} // closed and replaced at every acquire
}

func (x *exploration) newSideWorker(t testing.TB, cli *Client, name string) *sideWorker {
	open := func() (Locker, error) { return x.r.w.Open(cli.Client, name) }
	lk, err := open()
	if err != nil {
		t.Fatal(err)
	}
	return &sideWorker{name: name, cli: cli, lk: lk, open: open, changed: make(chan struct{})}
}

func (s *sideWorker) run(r *Run) {
	for !r.stopped() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := s.lk.Lock(ctx)
		cancel()
		if err != nil {
			r.wait(pause)
			continue
		}
		s.mu.Lock()
		s.acquires++
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		if outcome, _ := r.unlockUntilKnown(s.lk.Unlock); outcome == Ambiguous {
			if lk, err := s.open(); err == nil {
				s.lk = lk
			}
		}
	}
}

// next is a channel closed at the side worker's next acquire.
func (s *sideWorker) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// healAll undoes every fault: rules, cuts, partitions, stopped members.
func (x *exploration) healAll(ctx context.Context) {
	for _, c := range x.clients {
		c.Inj.Clear()
	}
	x.r.healAll()
	if _, err := x.r.env.leader(ctx); err != nil {
		x.t.Fatal(err)
	}
}

// dumpGoroutines writes every goroutine's stack to dir, for a stall to be looked at, and
// says where.
func dumpGoroutines(dir string) string {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	path := filepath.Join(dir, "goroutines.txt")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		return ""
	}
	return "; goroutines in " + path
}

// ownGoroutines waits up to patience for every goroutine of the primitives (their packages
// and the core; not the tests' own, nor etcd's) to end, and lists those that have not.
func ownGoroutines(patience time.Duration) string {
	deadline := time.Now().Add(patience)
	for {
		var left []string
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "github.com/etcdsync/etcdsync/") &&
				!strings.Contains(g, "github.com/etcdsync/etcdsync/internal/testkit/faulttest") &&
				!strings.Contains(g, "github.com/etcdsync/etcdsync/internal/testkit/etcdtest") &&
				!strings.Contains(g, "_test.") && !strings.Contains(g, "testing.tRunner") {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
		time.Sleep(100 * time.Millisecond) // goroutines end with no event to await
	}
}
