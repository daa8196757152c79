package multitest_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// cluster is the single member etcdtest.Main starts; the harness starts 3 of its own.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// faultTTL is short, so that a holder cut off by a fault frees the names soon.
const faultTTL = 2 * time.Second

// TestMultiFault runs a Multi of two names through every fault of faulttest.Suite: each
// fenced write compares both names, the faults strike the first name's keys, and neither
// name keeps a key once every worker has released. ETCDSYNC_SOAK=10m runs it for ten
// minutes.
func TestMultiFault(t *testing.T) { faulttest.Suite(t, workload()) }

// TestMultiExplore runs a Multi of two names under the seeded schedules of
// faulttest.Explore. ETCDSYNC_EXPLORE=10m draws new seeds.
func TestMultiExplore(t *testing.T) { faulttest.Explore(t, workload()) }

func workload() faulttest.Workload {
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
		Seed:     2, // the explorer's seed in CI: each primitive another of 1, 2, 3
		Lost:     mutex.ErrLost,
	}
}
