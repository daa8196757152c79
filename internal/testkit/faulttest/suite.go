package faulttest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
)

const (
	warmUp      = 3  // acquires before a fault strikes
	settleShort = 20 // acquires after the first one served once a fault healed
	settleSoak  = 40 // the same in a soak
)

// SoakEnv names the environment variable that turns Suite into a soak: a duration
// ("10m") for which it runs the faults in turn.
const SoakEnv = "ETCDSYNC_SOAK"

// approachOften has a waiter with more than one key ahead approach (see package core's
// follow.go) when its client has no watch of the name, as a fleet's far-back waiters do:
// the suites have few clients. It returns what undoes it.
func approachOften() func() { return core.SetNearAhead(1) }

// Suite runs w through every Fault (one of each Pair), in turn on one Env, and then every
// AuthFault on an Env with auth (started once the first is closed), one subtest each. With
// SoakEnv set to a duration, it runs them all over and over, with more workload after
// each, until that duration has passed, going on after failures. It skips in -short mode.
func Suite(t *testing.T, w Workload) {
	if testing.Short() {
		t.Skip("fault tests start a 3-member cluster and take minutes")
	}
	soak, err := soakDuration()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(approachOften())
	es := &envs{t: t}
	faults := func(yield func(*Env, Fault) bool) {
		for _, f := range Faults() {
			if f.Pair != 0 && soak == 0 && f.Pair != 2-int(w.Seed%2) {
				continue // its pair's other runs for this workload
			}
			if !yield(es.get(false), f) {
				return
			}
		}
		for _, f := range AuthFaults() {
			if !yield(es.get(true), f) {
				return
			}
		}
	}
	if soak == 0 {
		i := 0
		for env, f := range faults {
			name := fmt.Sprintf("fault-%d", i)
			t.Run(f.Name, func(t *testing.T) { RunFault(t, env, w, name, f, settleShort) })
			i++
		}
		return
	}
	deadline := time.Now().Add(soak)
	for round := 0; time.Now().Before(deadline); round++ {
		i := 0
		for env, f := range faults {
			name := fmt.Sprintf("soak-%d-%d", round, i)
			// On after a failure too: each run has a name of its own, and healAll leaves
			// the cluster whole, so the soak reports every kind of violation it meets.
			t.Run(fmt.Sprintf("%d/%s", round, f.Name), func(t *testing.T) { RunFault(t, env, w, name, f, settleSoak) })
			i++
		}
	}
}

func soakDuration() (time.Duration, error) {
	v := os.Getenv(SoakEnv)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("faulttest: %s=%q is not a positive duration", SoakEnv, v)
	}
	return d, nil
}

// RunFault runs w on env under the lock name through f: it warms up, injects f, checks
// that a waiter (and a reader, if w has readers) is served within the serve bound after f
// healed, lets settle more holds happen, stops the workers and checks the run (Run.Check).
func RunFault(t *testing.T, env *Env, w Workload, name string, f Fault, settle int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var observers []func(context.Context) error
	if w.Observe != nil {
		for i := range env.Cluster.Size() {
			observers = append(observers, w.Observe(ctx, env.SpreadClient(t, i).Client, name))
		}
	}
	r := env.Start(t, w, name)
	defer r.healAll() // after a failure, so that the next fault finds the cluster whole
	if _, err := r.hist.awaitAcquires(ctx, warmUp, 0, -1); err != nil {
		t.Fatalf("no warm-up: %v", err)
	}
	start := time.Now()
	healed := f.Inject(ctx, t, r)
	t.Logf("%s: injected and healed in %v", f.Name, time.Since(start).Round(time.Millisecond))

	bound := w.serveBound()
	sctx, scancel := context.WithTimeout(ctx, bound)
	served, err := r.hist.awaitAcquires(sctx, 1, healed, -1)
	if err != nil {
		t.Errorf("liveness: no waiter served within %v after %s healed: %v", bound, f.Name, err)
	} else {
		t.Logf("first waiter served %v after the fault healed", (served - healed).Round(time.Millisecond))
	}
	if w.OpenReader != nil {
		// Under the same deadline: a reader too must be served within the bound.
		if read, err := r.hist.awaitKind(sctx, ReadAcquire, 1, healed, -1); err != nil {
			t.Errorf("liveness: no reader served within %v after %s healed: %v", bound, f.Name, err)
		} else {
			t.Logf("first reader served %v after the fault healed", (read - healed).Round(time.Millisecond))
		}
	}
	scancel()
	if err == nil {
		if _, err := r.hist.awaitAcquires(ctx, settle, served, -1); err != nil {
			t.Errorf("liveness: the workload did not go on after %s: %v", f.Name, err)
		}
	}
	r.Stop()
	for i, converged := range observers {
		cctx, cancel := context.WithTimeout(ctx, bound)
		if err := converged(cctx); err != nil {
			t.Errorf("observer %d after %s: %v", i, f.Name, err)
		}
		cancel()
	}
	r.Check(t)
}

// healAll undoes whatever a fault that stopped half-way left: partitions, stopped members,
// black-holed or paused clients. It does nothing to a whole cluster.
func (r *Run) healAll() {
	c := r.env.Cluster
	var wg sync.WaitGroup
	for i := range c.Size() {
		if c.Partitioned(i) {
			c.Heal(i)
		}
		wg.Go(func() { _ = c.Restart(i) }) // together, as they need a quorum; fails at once if running
	}
	wg.Wait()
	for _, wk := range r.workers {
		wk.cli.Restore()
		wk.cli.Resume()
	}
	for _, rd := range r.readers {
		rd.cli.Restore()
		rd.cli.Resume()
	}
}
