package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestFencedIncrementsSurviveLeaderRestart runs read-modify-write increments of one counter
// under the mutex on a 3-member cluster while the leader is stopped (gracefully: it hands
// leadership over, or hard: as a crash) and restarted. Each increment also writes a marker
// key in its Txn, so afterwards the counter must equal the number of markers and the number
// of increments the workers counted: none lost (two holders at once would overwrite each
// other) and none doubled.
func TestFencedIncrementsSurviveLeaderRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	for _, tc := range []struct {
		desc string
		stop func(*etcdtest.Cluster, int)
	}{
		{"leader stopped", (*etcdtest.Cluster).Stop},
		{"leader killed", (*etcdtest.Cluster).Kill},
	} {
		t.Run(tc.desc, func(t *testing.T) { fencedIncrementsAcrossRestart(t, tc.stop) })
	}
}

func fencedIncrementsAcrossRestart(t *testing.T, stop func(*etcdtest.Cluster, int)) {
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The data lives outside the lock's prefix "failover/": a key under it would queue ahead
	// of every waiter.
	const workers, increments, counter = 4, 40, "failover-data/counter"

	progress := make(chan struct{}, workers*increments)
	var wg sync.WaitGroup
	for w := range workers {
		cli := c.Client(t)
		m := newMutex(t, cli, "failover")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < increments; {
				done, err := incrementUnderLock(ctx, cli, m, counter, fmt.Sprintf("failover-data/marker/%d/%d", w, i))
				if ctx.Err() != nil {
					t.Errorf("worker %d: out of time at increment %d: %v", w, i, err)
					return
				}
				if done {
					i++
					progress <- struct{}{}
				}
			}
		}()
	}

	awaitProgress(ctx, t, progress, workers*increments/4, "before the stop")
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	stop(c, leader)
	awaitProgress(ctx, t, progress, workers*increments/4, "without the old leader")
	require.NoError(t, c.Restart(leader))
	wg.Wait()

	admin := c.Client(t)
	markers, err := admin.Get(ctx, "failover-data/marker/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	value, err := admin.Get(ctx, counter)
	require.NoError(t, err)
	require.Len(t, value.Kvs, 1)
	assert.Equal(t, int64(workers*increments), markers.Count, "markers")
	assert.Equal(t, strconv.Itoa(workers*increments), string(value.Kvs[0].Value), "counter")
}

// awaitProgress waits for n increments, failing the test if ctx ends first.
func awaitProgress(ctx context.Context, t *testing.T, progress <-chan struct{}, n int, when string) {
	t.Helper()
	for i := range n {
		select {
		case <-progress:
		case <-ctx.Done():
			t.Fatalf("%s: only %d of %d increments before the deadline", when, i, n)
		}
	}
}

// incrementUnderLock locks m, adds one to counter with a Txn fenced by IsOwner that also
// creates marker, and unlocks. done says whether the increment happened; after an answer
// that was lost, the marker tells.
func incrementUnderLock(ctx context.Context, cli *clientv3.Client, m *mutex.Mutex, counter, marker string) (done bool, err error) {
	opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.Lock(opCtx); err != nil {
		return false, err
	}
	defer func() {
		// An Unlock that could not reach etcd in time leaves the lock held, and the client's
		// lease keeps the key: try again, as a caller must, until released or lost (the
		// handle's next Lock would wait for this hold, and every other worker behind its key).
		for {
			uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := m.Unlock(uctx)
			cancel()
			if err == nil || errors.Is(err, mutex.ErrNotLocked) || errors.Is(err, mutex.ErrLost) || ctx.Err() != nil {
				return
			}
		}
	}()
	resp, err := cli.Get(opCtx, counter)
	if err != nil {
		return false, err
	}
	n := 0
	if len(resp.Kvs) == 1 {
		if n, err = strconv.Atoi(string(resp.Kvs[0].Value)); err != nil {
			return false, err
		}
	}
	_, err = cli.Txn(opCtx).
		If(m.IsOwner(), clientv3.Compare(clientv3.CreateRevision(marker), "=", 0)).
		Then(clientv3.OpPut(counter, strconv.Itoa(n+1)), clientv3.OpPut(marker, "")).
		Commit()
	check, cerr := cli.Get(ctx, marker, clientv3.WithCountOnly())
	for cerr != nil && ctx.Err() == nil {
		check, cerr = cli.Get(ctx, marker, clientv3.WithCountOnly())
	}
	if cerr != nil {
		return false, cerr
	}
	return check.Count == 1, err
}
