package mutex_test

import (
	"testing"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// cluster is the single member etcdtest.Main starts. Tests with names and clients of their
// own that wait on timers or on a cluster of their own run in parallel (t.Parallel); the
// fault suites, the tests that stop, partition or restart members, check the whole
// keyspace's writes or goroutines, or hang on a short TTL or a measured time do not.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

var newMutex = primtest.MustNew(mutex.New)
