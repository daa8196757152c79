package mutex_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
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
		Lost:   mutex.ErrLost,
	}
}

// TestMultiFault runs a Multi of two names through every fault of faulttest.Suite: each
// fenced write compares both names, the faults strike the first name's keys, and neither
// name keeps a key once every worker has released.
func TestMultiFault(t *testing.T) { faulttest.Suite(t, multiWorkload()) }

// TestMultiExplore runs a Multi of two names under the seeded schedules of
// faulttest.Explore.
func TestMultiExplore(t *testing.T) { faulttest.Explore(t, multiWorkload()) }

func multiWorkload() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			m, err := mutex.NewMulti(cli, []string{name, primtest.MultiPartner(name)}, mutex.WithTTL(faultTTL))
			if err != nil {
				return nil, err
			}
			return primtest.NewMultiLocker(m, name), nil
		},
		Prefix:   core.NamePrefix,
		Partners: func(name string) []string { return []string{primtest.MultiPartner(name)} },
		TTL:      faultTTL,
		Slots:    1,
		Lost:     mutex.ErrLost,
	}
}
