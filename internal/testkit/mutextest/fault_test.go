package mutex_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/mutex"
)

// faultTTL is short, so that a holder cut off by a fault frees the lock soon.
const faultTTL = 2 * time.Second

// TestFault runs the mutex through every fault of faulttest.Suite and its checks (fenced
// register, exclusion, linearizability, liveness, no key left). ETCDSYNC_SOAK=10m runs it
// for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs the mutex under schedules of operations and faults drawn from seeds
// (faulttest.Explore). ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			return mutex.New(cli, name, mutex.WithTTL(faultTTL))
		},
		Prefix: core.NamePrefix,
		TTL:    faultTTL,
		Slots:  1,
		Seed:   3, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:   mutex.ErrLost,
	}
}
