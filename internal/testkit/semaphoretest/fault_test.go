package semaphore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/semaphore"
)

const (
	faultTTL   = 2 * time.Second // short, so that a holder cut off by a fault frees its permit soon
	faultLimit = 4               // units; the harness's 4 workers take 1, 1, 2 and 3 of them
)

// faultUnits are the units of the workers' permits, by the order they open their handles:
// two hold at once, or three when both of one unit do, and the heaviest needs company gone.
var faultUnits = []int{1, 1, 2, 3}

// TestFault runs the semaphore, with permits of mixed units, through every fault of the shared harness (leader stopped and
// killed, leader partitioned, a holder paused and one whose lease is revoked, compaction
// under waiters, the whole cluster restarted) on a 3-member cluster with clients on every
// member, and checks the fenced register (no increment lost or doubled), that never more
// than the limit's units are held at once, linearizability, liveness after each fault and that no
// permit key is left. ETCDSYNC_SOAK=10m runs it for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs permits of mixed units under schedules of operations and faults drawn from seeds (see
// faulttest.Explore). ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	var opened atomic.Int64
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			s, err := semaphore.New(cli, name, faultLimit, semaphore.WithTTL(faultTTL))
			units := faultUnits[int(opened.Add(1)-1)%len(faultUnits)]
			return primtest.NewPermits(s, units), err
		},
		// The limit record stays by design: only permits must be gone.
		Prefix:   permitPrefix,
		TTL:      faultTTL,
		Slots:    faultLimit,
		KeyUnits: keyUnits,
		Seed:     3, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:     semaphore.ErrLost,
		Disturb:  lowerTheLimitAWhile,
	}
}

// lowerTheLimitAWhile lowers the limit to the most units a worker asks (so that no waiter
// fails), for up to a second, and raises it back: waiters hear both changes in order with
// the releases, approaching ones too, and the checks of the run (at most faultLimit units,
// liveness once healed) hold across them. Both ride out etcd's unavailability until ctx
// ends; a limit left lowered still serves every worker.
func lowerTheLimitAWhile(ctx context.Context, cli *clientv3.Client, name string, rng *rand.Rand) (string, error) {
	s, err := semaphore.New(cli, name, faultLimit)
	if err != nil {
		return "", err
	}
	lowered := slices.Max(faultUnits)
	if err := s.SetLimit(ctx, lowered); err != nil {
		return "", fmt.Errorf("lower the limit: %w", err)
	}
	d := time.Duration(rng.IntN(1000)) * time.Millisecond
	if err := core.Pause(ctx, d); err != nil {
		return "", err
	}
	if err := s.SetLimit(ctx, faultLimit); err != nil {
		return "", fmt.Errorf("raise the limit back: %w", err)
	}
	return fmt.Sprintf("limit %d for %v, then %d", lowered, d, faultLimit), nil
}

// keyUnits reads a permit key's units: "…/permit/u<n>/…" holds n, any other key one.
func keyUnits(key string) int {
	_, rest, ok := strings.Cut(key, "/permit/u")
	if !ok {
		return 1
	}
	digits, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 1
	}
	return n
}
