package core_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// countedClient is a client whose RPCs are counted.
func countedClient(t *testing.T) (*clientv3.Client, *rpcstat.Counter) {
	t.Helper()
	return countedClientOf(t, cluster)
}

// countedClientOf is countedClient on the cluster c.
func countedClientOf(t *testing.T, c *etcdtest.Cluster) (*clientv3.Client, *rpcstat.Counter) {
	t.Helper()
	cnt := &rpcstat.Counter{}
	cfg := c.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	cli, err := c.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli, cnt
}

// awaitCount returns once the name's prefix holds n keys.
func awaitCount(t *testing.T, cli *clientv3.Client, name string, n int64) {
	t.Helper()
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), n)
}

// acquireAsync starts an Acquire and returns where its result arrives.
func acquireAsync(ctx context.Context, q *core.Queue, spec core.Spec) <-chan *core.Hold {
	got := make(chan *core.Hold, 1)
	go func() {
		h, err := q.Acquire(ctx, spec, nil)
		if err != nil {
			h = nil
		}
		got <- h
	}()
	return got
}

// TestWaitersOfOneClientShareOneWatch queues many waiters of one client on a name, once the
// first has opened the client's watch of it: they all share that watch, so a release reaches
// each client once, however many of its waiters wait (also those far back in line, which
// would otherwise approach first).
func TestWaitersOfOneClientShareOneWatch(t *testing.T) {
	ctx := testContext(t)
	const name, waiters = "one-watch", 20
	holder := queue(t, cluster.Client(t), name)
	first, err := holder.Acquire(ctx, exclusive, nil)
	require.NoError(t, err)

	cli, cnt := countedClient(t)
	q := queue(t, cli, name)
	results := make([]<-chan *core.Hold, waiters)
	results[0] = acquireAsync(ctx, q, exclusive)
	require.Eventually(t, func() bool { return core.HasHub(cli, name) }, 10*time.Second, time.Millisecond)
	for i := range results[1:] {
		results[i+1] = acquireAsync(ctx, q, exclusive)
	}
	awaitCount(t, cluster.Client(t), name, waiters+1)
	_, err = first.Release(ctx)
	require.NoError(t, err)
	served, anyResult := 0, anyOf(results)
	for range waiters { // in whatever order they come: each releases at once
		select {
		case h := <-anyResult:
			require.NotNil(t, h, "a waiter failed")
			served++
			_, err := h.Release(ctx)
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatalf("only %d of %d waiters served", served, waiters)
		}
	}
	assert.Equal(t, int64(1), cnt.Counts()["Watch.send"], "watches created for %d waiters", waiters)
}

// anyOf merges chans, each of which yields once.
func anyOf(chans []<-chan *core.Hold) <-chan *core.Hold {
	out := make(chan *core.Hold, len(chans))
	for _, c := range chans {
		go func() { out <- <-c }()
	}
	return out
}

// TestACancelledWaiterAheadDoesNotHoldUpTheNext cancels waiters in the middle of the queue,
// on the same client as the waiter behind them and on another: their deletes count as keys
// ahead that went, and the last waiter is served when the holder releases.
func TestACancelledWaiterAheadDoesNotHoldUpTheNext(t *testing.T) {
	ctx := testContext(t)
	const name = "cancel-middle"
	cli, other := cluster.Client(t), cluster.Client(t)
	h, err := queue(t, other, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)

	var cancels []context.CancelFunc
	for i, c := range []*clientv3.Client{cli, other} {
		wctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		acquireAsync(wctx, queue(t, c, name), exclusive)
		awaitCount(t, cli, name, int64(i+2))
	}
	last := acquireAsync(ctx, queue(t, cli, name), exclusive)
	awaitCount(t, cli, name, 4)
	for _, cancel := range cancels {
		cancel()
	}
	awaitCount(t, cli, name, 2)
	select {
	case <-last:
		t.Fatal("served while the holder holds")
	default:
	}
	_, err = h.Release(ctx)
	require.NoError(t, err)
	select {
	case got := <-last:
		require.NotNil(t, got)
		_, err := got.Release(ctx)
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the last waiter was not served after the release")
	}
}

// TestOnlyKeysOfTheAheadKindCount waits with Spec.Ahead naming one kind: keys of another
// kind ahead do not hold it up, keys of its kind do.
func TestOnlyKeysOfTheAheadKindCount(t *testing.T) {
	ctx := testContext(t)
	const name = "kinds"
	read := core.Spec{Kind: "r", Ahead: "w"}
	write := core.Spec{Kind: "w"}
	cli := cluster.Client(t)
	r1, err := queue(t, cli, name).Acquire(ctx, read, nil)
	require.NoError(t, err)
	r2, err := queue(t, cluster.Client(t), name).Acquire(ctx, read, nil)
	require.NoError(t, err, "a reader waited for a reader")

	w := acquireAsync(ctx, queue(t, cluster.Client(t), name), write)
	awaitCount(t, cli, name, 3)
	r3 := acquireAsync(ctx, queue(t, cluster.Client(t), name), read)
	awaitCount(t, cli, name, 4)
	for i, h := range []*core.Hold{r1, r2} {
		select {
		case <-w:
			t.Fatalf("the writer came in with %d readers ahead", 2-i)
		default:
		}
		_, err := h.Release(ctx)
		require.NoError(t, err)
	}
	wh := <-w
	require.NotNil(t, wh)
	select {
	case <-r3:
		t.Fatal("a reader behind a writer came in while it holds")
	case <-time.After(200 * time.Millisecond):
	}
	_, err = wh.Release(ctx)
	require.NoError(t, err)
	rh := <-r3
	require.NotNil(t, rh, "the reader after the writer")
	_, err = rh.Release(ctx)
	require.NoError(t, err)
}
