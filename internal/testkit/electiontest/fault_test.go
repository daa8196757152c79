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
		Disturb:   askToMove,
		HandsOver: true,
		Observe:   observe,
		Prefix:    core.NamePrefix,
		TTL:       faultTTL,
		Slots:     1,
		Seed:      1, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:      election.ErrLost,
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
		err := c.Yield(ctx)
		if errors.Is(err, election.ErrNoCandidate) {
			return c.Resign(ctx) // the candidate left, or did not take over: it was taken back
		}
		return err
	default:
		return c.Resign(ctx)
	}
}

// askToMove asks the leader, from the admin client, to step down, or, as often, to hand its
// leadership over to a candidate drawn among those waiting, and waits up to two TTLs for the
// answer (a Run ends its lead first; a Campaign's worker answers at its Unlock): the request,
// the asker that follows it and the handover ride out the faults, and the checks of the run
// (one leader, linearizability with the token handed over, liveness once healed, no key
// left) hold across them.
func askToMove(ctx context.Context, cli *clientv3.Client, name string, rng *rand.Rand) (string, error) {
	e, err := election.New(cli, name, election.WithTTL(faultTTL))
	if err != nil {
		return "", err
	}
	to, what := "", "a step-down"
	if rng.IntN(2) == 0 {
		resp, err := cli.Get(ctx, core.NamePrefix(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err == nil && len(resp.Kvs) > 1 {
			kv := resp.Kvs[1+rng.IntN(len(resp.Kvs)-1)]
			to, what = string(kv.Value), fmt.Sprintf("a transfer to %q", kv.Value)
		}
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
	l, err := e.RequestTransfer(rctx, to)
	switch {
	case errors.Is(err, election.ErrNoLeader):
		return what + " asked: nobody led", nil
	case errors.Is(err, election.ErrNoCandidate):
		return what + " asked: not made (" + err.Error() + ")", nil
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return what + " asked: no answer within two TTLs (withdrawn)", nil
	case err != nil:
		return "", fmt.Errorf("ask %s: %w", what, err)
	}
	return fmt.Sprintf("%s asked: %q leads after it", what, l.Value), nil
}
