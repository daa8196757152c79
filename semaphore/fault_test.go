package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/faulttest"
	"github.com/etcdsync/etcdsync/semaphore"
)

const (
	faultTTL   = 2 * time.Second // short, so that a holder cut off by a fault frees its permit soon
	faultLimit = 3               // of the harness's 4 workers, 3 hold at once
)

// TestFault runs the semaphore through every fault of the shared harness (leader stopped and
// killed, leader partitioned, a holder paused and one whose lease is revoked, compaction
// under waiters, the whole cluster restarted) on a 3-member cluster with clients on every
// member, and checks the fenced register (no increment lost or doubled), that never more
// than the limit hold at once, linearizability, liveness after each fault and that no
// permit key is left. ETCDSYNC_SOAK=10m runs it for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs permits under schedules of operations and faults drawn from seeds (see
// faulttest.Explore). ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			s, err := semaphore.New(cli, name, faultLimit, semaphore.WithTTL(faultTTL))
			return &permitLocker{s: s}, err
		},
		// The limit record stays by design: only permits must be gone.
		Prefix: permitPrefix,
		TTL:    faultTTL,
		Slots:  faultLimit,
		Lost:   semaphore.ErrLost,
	}
}

// permitLocker is a semaphore as the harness's Locker: Lock takes a permit and keeps it,
// Unlock releases it.
type permitLocker struct {
	s  *semaphore.Semaphore
	mu sync.Mutex
	p  *semaphore.Permit
}

func (l *permitLocker) Lock(ctx context.Context) error {
	p, err := l.s.Acquire(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.p = p
	l.mu.Unlock()
	return nil
}

// TryLock takes a permit only if one is free and nobody waits.
func (l *permitLocker) TryLock(ctx context.Context) error {
	p, err := l.s.TryAcquire(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.p = p
	l.mu.Unlock()
	return nil
}

// Done and Err are the permit's.
func (l *permitLocker) Done() <-chan struct{} { return l.permit().Done() }
func (l *permitLocker) Err() error            { return l.permit().Err() }

func (l *permitLocker) permit() *semaphore.Permit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p
}

func (l *permitLocker) Unlock(ctx context.Context) error {
	err := l.permit().Release(ctx)
	// A Release that neither released nor found the permit gone keeps it, for the retry.
	if err == nil || errors.Is(err, semaphore.ErrLost) || errors.Is(err, semaphore.ErrNotLocked) {
		l.mu.Lock()
		l.p = nil
		l.mu.Unlock()
	}
	return err
}

func (l *permitLocker) Token() int64          { return l.permit().Token() }
func (l *permitLocker) IsOwner() clientv3.Cmp { return l.permit().IsOwner() }
