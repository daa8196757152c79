package mutex_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/faulttest"
	"github.com/etcdsync/etcdsync/mutex"
)

// faultTTL is short, so that a holder cut off by a fault frees the lock soon.
const faultTTL = 2 * time.Second

// TestFault runs the mutex through every fault of the shared harness (leader stopped and
// killed, leader partitioned, a holder paused and one whose lease is revoked, compaction
// under waiters, the whole cluster restarted) on a 3-member cluster with clients on every
// member, and checks the fenced register, exclusion, linearizability, liveness after each
// fault and that no key is left. ETCDSYNC_SOAK=10m runs it for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs the mutex under schedules of operations and faults drawn from seeds
// (see faulttest.Explore): several handles per client, cancellations at random moments,
// leases revoked under several holds and waiters, operators deleting keys, answers late or
// lost, clients cut off beside healthy ones. ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			return mutex.New(cli, name, mutex.WithTTL(faultTTL))
		},
		Prefix: core.NamePrefix,
		TTL:    faultTTL,
		Slots:  1,
		Lost:   mutex.ErrLost,
	}
}
