package rwmutex_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// faultTTL is short, so that a holder cut off by a fault frees the lock soon.
const faultTTL = 2 * time.Second

// TestFault runs the RWMutex through every fault of faulttest.Suite and its checks: writers
// under fenced writes, readers sharing handles two goroutines each and never beside a
// writer. ETCDSYNC_SOAK=10m runs it for ten minutes.
func TestFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestExplore runs writers and readers under schedules of operations and faults drawn from
// seeds (faulttest.Explore). ETCDSYNC_EXPLORE=10m draws new seeds.
func TestExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
	open := func(cli *clientv3.Client, name string) (*rwmutex.RWMutex, error) {
		return rwmutex.New(cli, name, rwmutex.WithTTL(faultTTL))
	}
	return faulttest.Workload{
		Open:       func(cli *clientv3.Client, name string) (faulttest.Locker, error) { return open(cli, name) },
		OpenReader: func(cli *clientv3.Client, name string) (faulttest.Reader, error) { return open(cli, name) },
		Prefix:     core.NamePrefix,
		TTL:        faultTTL,
		Slots:      1,
		Seed:       1, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:       rwmutex.ErrLost,
	}
}
