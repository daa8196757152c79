package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// costClients are two plain clients (no namespace: a namespaced client's holds each watch
// on their own, see docs/guarantees.md) of a server that runs outside this process, so that
// the heap this process measures is the client's alone: ETCD_ENDPOINTS, or one etcd server
// process when etcd is on PATH. Without either the cost tests skip: an embedded member's heap
// would be counted with the client's. root is where the test's keys go (the run's prefix on
// an external cluster), and opts put a Mutex's keys there.
func costClients(t *testing.T) (cli, other *clientv3.Client, root string, opts []mutex.Option) {
	t.Helper()
	c := cluster
	if !c.External() {
		bin := etcdtest.ServerBinary()
		if bin == "" {
			t.Skip("needs a server outside this process: ETCD_ENDPOINTS, or etcd on PATH")
		}
		var err error
		c, err = etcdtest.NewProcesses(1, bin)
		require.NoError(t, err)
		t.Cleanup(c.Close)
	}
	if root = c.Prefix(); root != "" {
		opts = append(opts, mutex.WithPrefix(root))
	}
	return etcdtest.ClientOf(t, c.Endpoints()...), etcdtest.ClientOf(t, c.Endpoints()...), root, opts
}

// holdsToCount is how many holds the cost test takes: 5,000, or ETCDSYNC_HOLDS (the long
// tier takes 100,000; see docs/testing.md).
func holdsToCount(t *testing.T) int {
	n := 5000
	if s := os.Getenv("ETCDSYNC_HOLDS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err, "ETCDSYNC_HOLDS")
	}
	return n
}

// heapNow is the live heap after a full collection.
func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestCostPerHold: n mutex holds on one client, each watched (Done called), cost at most
// 1 KiB of the client's heap each and no goroutine per hold; every one of them still learns
// of its loss (a delete of its key closes its Done), and every one is released cleanly. The
// same count of etcd's concurrency.Mutex on one session is measured beside it for the
// record.
func TestCostPerHold(t *testing.T) {
	if raceDetector {
		// The detector's bookkeeping is not what a user's process carries, and it makes the
		// 5,000 holds slow: CI measures this in its short tier against each server, without it.
		t.Skip("a measurement of the client's heap: not under the race detector")
	}
	cli, other, root, opts := costClients(t)
	n := holdsToCount(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+time.Duration(n)*10*time.Millisecond)
	defer cancel()
	prefix := fmt.Sprintf("cost-%d/", time.Now().UnixNano())
	keys := root + prefix // where the holds' keys are
	t.Cleanup(func() { _, _ = other.Delete(context.Background(), keys, clientv3.WithPrefix()) })

	// Warm up: the session, the client's streams and the package's first allocations.
	warm := newMutex(t, cli, prefix+"warm", opts...)
	require.NoError(t, warm.Lock(ctx))
	<-closedAfterDelete(t, other, warm)
	_ = warm.Unlock(ctx)

	goroutines := runtime.NumGoroutine()
	before := heapNow()
	start := time.Now()
	ms := make([]*mutex.Mutex, n)
	dones := make([]<-chan struct{}, n)
	for i := range ms {
		ms[i] = newMutex(t, cli, fmt.Sprintf("%sm%d", prefix, i), opts...)
	}
	require.NoError(t, inParallel(n, func(i int) error {
		if err := ms[i].Lock(ctx); err != nil {
			return err
		}
		dones[i] = ms[i].Done()
		return nil
	}))
	took := time.Since(start)
	// The last hold's watch is told of its key's delete: every watch is in place.
	_, err := other.Delete(ctx, ms[n-1].Key())
	require.NoError(t, err)
	etcdtest.Within(t, dones[n-1], time.Minute, "the last hold's Done after its key's delete")
	perHold := int64(heapNow()-before) / int64(n)
	extra := runtime.NumGoroutine() - goroutines
	t.Logf("%d holds on one client, Done on each: %d bytes and %.3f goroutines per hold (%d in all); took %v to lock",
		n, perHold, float64(extra)/float64(n), extra, took.Round(time.Millisecond))
	require.LessOrEqual(t, perHold, int64(1024), "heap per watched hold")
	require.Less(t, extra, 16, "goroutines for %d watched holds", n)
	for i := 0; i < n-1; i++ {
		select {
		case <-dones[i]:
			t.Fatalf("hold %d ended unasked", i)
		default:
		}
	}

	// Every watch still tells: delete a spread of keys, and each of those holds is told.
	for i := 0; i < n-1; i += max(1, n/50) {
		_, err := other.Delete(ctx, ms[i].Key())
		require.NoError(t, err)
		etcdtest.Within(t, dones[i], time.Minute, fmt.Sprintf("hold %d's Done after its key's delete", i))
		require.ErrorIs(t, ms[i].Err(), mutex.ErrLost)
	}
	_ = inParallel(n, func(i int) error { _ = ms[i].Unlock(ctx); return nil })
	etcdtest.AwaitKeys(t, other, keys, 0)

	// etcd's own Mutex, for the record: its holds tell nobody of a loss.
	sess, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer sess.Close()
	before = heapNow()
	theirs := make([]*concurrency.Mutex, n)
	for i := range theirs {
		theirs[i] = concurrency.NewMutex(sess, fmt.Sprintf("%se%d", keys, i))
	}
	require.NoError(t, inParallel(n, func(i int) error { return theirs[i].Lock(ctx) }))
	t.Logf("etcd's concurrency.Mutex, %d holds on one session: %d bytes per hold",
		n, int64(heapNow()-before)/int64(n))
	require.NoError(t, inParallel(n, func(i int) error { return theirs[i].Unlock(ctx) }))
}

// inParallel calls f(i) for every i below n, from 16 goroutines, and returns the first
// error.
func inParallel(n int, f func(i int) error) error {
	var next atomic.Int64
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n && errs[w] == nil; i = int(next.Add(1)) - 1 {
				errs[w] = f(i)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closedAfterDelete deletes m's key through other and returns m's Done.
func closedAfterDelete(t *testing.T, other *clientv3.Client, m *mutex.Mutex) <-chan struct{} {
	t.Helper()
	done := m.Done()
	_, err := other.Delete(context.Background(), m.Key())
	require.NoError(t, err)
	etcdtest.Within(t, done, time.Minute, "Done after the key's delete")
	return done
}
