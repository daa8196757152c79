package election_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// faultTTL is short, so that a leader cut off by a fault hands over soon.
const faultTTL = 2 * time.Second

// TestFault runs the election through every fault of faulttest.Suite and its checks, with
// observers on every member: never more than one leader, and every candidate and observer
// sees the election move on after each fault. ETCDSYNC_SOAK=10m runs it for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs candidates and observers under schedules of operations and faults drawn
// from seeds (faulttest.Explore); a quarter of the candidates' cycles are a Run, whose
// every term makes fenced writes. ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			e, err := election.New(cli, name, election.WithTTL(faultTTL))
			if err != nil {
				return nil, err
			}
			return heedingCandidate{primtest.NewCandidate(e)}, nil
		},
		Disturb: askAStepDown,
		Observe: observe,
		Prefix:  core.NamePrefix,
		TTL:     faultTTL,
		Slots:   1,
		Seed:    1, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:    election.ErrLost,
	}
}

// observe follows the election called name through Observe until ctx ends. Its check
// passes once the observer has seen a leader and then no leader (every candidate resigned),
// with the leaders' tokens only ever increasing: through the fault, the observer neither
// stopped, nor replayed an old leader, nor missed the final state.
func observe(ctx context.Context, cli *clientv3.Client, name string) func(context.Context) error {
	e, err := election.New(cli, name, election.WithTTL(faultTTL))
	if err != nil {
		return func(context.Context) error { return err }
	}
	var (
		mu       sync.Mutex
		last     election.Leader
		top      int64 // highest token seen
		leaders  int
		disorder error
		closed   bool
	)
	changed := make(chan struct{}, 1)
	go func() {
		for l := range e.Observe(ctx) {
			mu.Lock()
			if l.Token != 0 {
				if l.Token < top && disorder == nil {
					disorder = fmt.Errorf("leader token %d after %d", l.Token, top)
				}
				top = max(top, l.Token)
				leaders++
			}
			last = l
			mu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
		}
		mu.Lock()
		closed = true
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
	}()
	return func(cctx context.Context) error {
		for {
			mu.Lock()
			l, n, bad, gone := last, leaders, disorder, closed
			mu.Unlock()
			switch {
			case bad != nil:
				return bad
			case n > 0 && l.Token == 0:
				return nil
			case gone:
				return fmt.Errorf("Observe closed at %+v after %d leaders", l, n)
			}
			select {
			case <-changed:
			case <-cctx.Done():
				return fmt.Errorf("observer still at %+v after %d leaders: %w", l, n, cctx.Err())
			}
		}
	}
}

// heedingCandidate is a Candidate that follows the requests to its leadership from the
// grant on and does what one asked at its Unlock (Yield: a step-down), so that the requests
// of askAStepDown reach the workers that lead by Campaign too; those that lead by Run heed
// them by themselves.
type heedingCandidate struct{ *primtest.Candidate }

func (c heedingCandidate) Lock(ctx context.Context) error {
	if err := c.Candidate.Lock(ctx); err != nil {
		return err
	}
	c.Asked()
	return nil
}

func (c heedingCandidate) Unlock(ctx context.Context) error {
	select {
	case <-c.Asked():
		return c.Yield(ctx)
	default:
		return c.Resign(ctx)
	}
}

// askAStepDown asks the leader, from the admin client, to step down, and waits up to two
// TTLs for the answer (a Run ends its lead and resigns; a Campaign's worker resigns at its
// Unlock): the request and the asker that follows it ride out the faults, and the checks of
// the run (one leader, linearizability, liveness once healed, no key left) hold across it.
func askAStepDown(ctx context.Context, cli *clientv3.Client, name string, _ *rand.Rand) (string, error) {
	e, err := election.New(cli, name, election.WithTTL(faultTTL))
	if err != nil {
		return "", err
	}
	// The request lies on a lease of the admin client's: let it go after, with its
	// keep-alive, as the run's own clients are let go.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = election.Shutdown(sctx, cli)
	}()
	rctx, cancel := context.WithTimeout(ctx, 2*faultTTL)
	defer cancel()
	l, err := e.RequestTransfer(rctx, "")
	switch {
	case errors.Is(err, election.ErrNoLeader):
		return "a step-down asked: nobody led", nil
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return "a step-down asked: no answer within two TTLs (withdrawn)", nil
	case err != nil:
		return "", fmt.Errorf("ask a step-down: %w", err)
	}
	return fmt.Sprintf("a step-down asked: %q leads after it", l.Value), nil
}
