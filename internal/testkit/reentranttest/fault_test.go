package reentrant_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/reentrant"
)

// faultTTL is short, so that a holder cut off by a fault frees the lock soon.
const faultTTL = 2 * time.Second

// TestFault runs the reentrant lock through every fault of faulttest.Suite and its checks,
// each hold taken and released recursively. ETCDSYNC_SOAK=10m runs it for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs recursive holds under schedules of operations and faults drawn from
// seeds (faulttest.Explore). ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			m, err := reentrant.New(cli, name, reentrant.WithTTL(faultTTL))
			if err != nil {
				return nil, err
			}
			return &recursiveLocker{m: m}, nil
		},
		Prefix: core.NamePrefix,
		TTL:    faultTTL,
		Slots:  1,
		Seed:   2, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:   reentrant.ErrLost,
	}
}

// faultDepth is how deep a worker of the fault suite locks for each hold.
const faultDepth = 2

// recursiveLocker is a faulttest.Locker that takes each hold faultDepth deep and gives it
// back one level per Unlock of the Mutex, so that re-entry and the counted release run
// under faults. The harness's contexts own nothing: Unlock runs on a copy of the owning
// context that carries the ownership but ends with the harness's ctx.
type recursiveLocker struct {
	m     *reentrant.Mutex
	owner context.Context // the owning context of the hold, nil without one
	due   int             // Unlocks of m still due
}

// Done is the Mutex's: closed when the hold ends, for the harness's self-fencing check.
func (l *recursiveLocker) Done() <-chan struct{} { return l.m.Done() }

func (l *recursiveLocker) Lock(ctx context.Context) error {
	octx, err := l.m.Lock(ctx)
	if err != nil {
		return err
	}
	return l.deepen(octx)
}

// TryLock is Lock with a TryLock for the first level.
func (l *recursiveLocker) TryLock(ctx context.Context) error {
	octx, err := l.m.TryLock(ctx)
	if err != nil {
		return err
	}
	return l.deepen(octx)
}

// deepen takes the levels after the first of the hold that octx owns.
func (l *recursiveLocker) deepen(octx context.Context) error {
	l.owner, l.due = octx, 1
	for l.due < faultDepth {
		// The harness cancels ctx, and so octx, once Lock returns: its holds outlive it.
		if _, err := l.m.Lock(context.WithoutCancel(octx)); err != nil {
			// Lost at once: give back what was taken.
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return errors.Join(err, l.Unlock(uctx))
		}
		l.due++
	}
	return nil
}

// Unlock gives back every level still due; an error other than ErrLost leaves the level
// that failed due, for the harness's next call.
func (l *recursiveLocker) Unlock(ctx context.Context) error {
	if l.due == 0 {
		return reentrant.ErrNotLocked
	}
	uctx, cancel := context.WithCancel(context.WithoutCancel(l.owner))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	var lost error
	for l.due > 0 {
		err := l.m.Unlock(uctx)
		if err != nil && !errors.Is(err, reentrant.ErrLost) {
			return err
		}
		lost = errors.Join(lost, err)
		l.due--
	}
	l.owner = nil
	return lost
}

func (l *recursiveLocker) Token() int64 { return l.m.Token() }

func (l *recursiveLocker) IsOwner() clientv3.Cmp { return l.m.IsOwner() }
