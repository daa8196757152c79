package core_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// pending is an Acquire under way: its key once written, and its result.
type pending struct {
	key    chan string
	result chan outcome
}

type outcome struct {
	h   *core.Hold
	err error
}

// enqueue starts an Acquire of spec on name, on a client of its own, and returns once its key is in etcd (the name
// then holds want keys, counted on cli).
func enqueue(ctx context.Context, t *testing.T, cli *clientv3.Client, name string, spec core.Spec, want int64) pending {
	t.Helper()
	return enqueueOn(ctx, t, cli, cluster.Client(t), name, spec, want)
}

// enqueueOn is enqueue on the client on.
func enqueueOn(ctx context.Context, t *testing.T, cli, on *clientv3.Client, name string, spec core.Spec, want int64) pending {
	t.Helper()
	q := queue(t, on, name)
	p := pending{key: make(chan string, 1), result: make(chan outcome, 1)}
	go func() {
		h, err := q.Acquire(ctx, spec, func(k string) { p.key <- k })
		p.result <- outcome{h, err}
	}()
	awaitCount(t, cli, name, want)
	return p
}

// served returns the hold p was granted, failing the test if p failed or took too long.
func (p pending) served(t *testing.T) *core.Hold {
	t.Helper()
	select {
	case r := <-p.result:
		require.NoError(t, r.err)
		return r.h
	case <-time.After(20 * time.Second):
		t.Fatal("not served")
		return nil
	}
}

// notYet fails the test if p has ended.
func (p pending) notYet(t *testing.T, why string) {
	t.Helper()
	select {
	case r := <-p.result:
		t.Fatalf("%s: ended with %v", why, r.err)
	default:
	}
}

// TestAFleetDrainsInOrderAndEachReleaseReachesFewClients queues one waiter on each of many
// clients, and drains the queue: they are served in the order they queued, and a release
// is heard by the clients of the few waiters behind it (and by a few that just had their
// turn), not by every client that waits.
func TestAFleetDrainsInOrderAndEachReleaseReachesFewClients(t *testing.T) {
	ctx := testContext(t)
	const name, fleet = "fleet", 32
	admin := cluster.Client(t)
	hold, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	waiters := make([]pending, fleet)
	counters := make([]*rpcstat.Counter, fleet)
	for i := range waiters {
		cli, cnt := countedClient(t)
		counters[i] = cnt
		waiters[i] = enqueueOn(ctx, t, admin, cli, name, exclusive, int64(i+2))
	}
	for i, w := range waiters {
		_, err := hold.Release(ctx)
		require.NoError(t, err)
		hold = w.served(t)
		if i+1 < fleet {
			waiters[i+1].notYet(t, fmt.Sprintf("waiter %d while %d holds", i+1, i))
		}
	}
	_, err = hold.Release(ctx)
	require.NoError(t, err)

	perRelease := float64(eventsHeard(counters)) / fleet
	bound := fewHearers()
	t.Logf("%d waiting clients: %.1f watch events heard per release", fleet, perRelease)
	assert.LessOrEqual(t, perRelease, bound, "a release reached about every waiting client")
}

// TestASemaphoreFleetDrainsInOrderAndEachReleaseReachesFewClients is the same for a
// semaphore of capacity 3 whose waiters take one or two units, released in an order other
// than the one they were served in: each is served once what it takes fits, in line order,
// and a release is heard by few of the waiting clients.
func TestASemaphoreFleetDrainsInOrderAndEachReleaseReachesFewClients(t *testing.T) {
	ctx := testContext(t)
	const name, fleet, capacity = "semfleet", 24, 3
	spec := func(units int) core.Spec {
		return core.Spec{Kind: core.KindPermit, Ahead: core.KindPermit, Capacity: capacity, Weight: units}
	}
	admin := cluster.Client(t)
	type held struct {
		h     *core.Hold
		units int
	}
	var holds []held
	for range capacity {
		h, err := queue(t, admin, name).Acquire(ctx, spec(1), nil)
		require.NoError(t, err)
		holds = append(holds, held{h, 1})
	}
	waiters := make([]pending, fleet)
	units := make([]int, fleet)
	counters := make([]*rpcstat.Counter, fleet)
	for i := range waiters {
		units[i] = 1 + i%3/2 // 1, 1, 2, ...
		cli, cnt := countedClient(t)
		counters[i] = cnt
		waiters[i] = enqueueOn(ctx, t, admin, cli, name, spec(units[i]), int64(capacity+i+1))
	}
	inUse, next, releases := capacity, 0, 0
	for len(holds) > 0 {
		// Release the hold in the middle, then serve every waiter that now fits.
		i := len(holds) / 2
		_, err := holds[i].h.Release(ctx)
		require.NoError(t, err)
		releases++
		inUse -= holds[i].units
		holds = append(holds[:i], holds[i+1:]...)
		for next < fleet && inUse+units[next] <= capacity {
			holds = append(holds, held{waiters[next].served(t), units[next]})
			inUse += units[next]
			next++
		}
		if next < fleet {
			waiters[next].notYet(t, fmt.Sprintf("waiter %d (%d units) with %d of %d in use", next, units[next], inUse, capacity))
		}
	}
	require.Equal(t, fleet, next)

	events := int64(0)
	for _, c := range counters {
		events += c.Counts()["Watch.events"]
	}
	perRelease := float64(events) / float64(releases)
	bound := float64(core.NearAhead() + capacity + core.LingerDeletes() + 3)
	t.Logf("%d waiting clients: %.1f watch events heard per release (bound %.0f)", fleet, perRelease, bound)
	assert.LessOrEqual(t, perRelease, bound, "a release reached about every waiting client")
}

// farBack queues a holder and n waiters, each on a client of its own, on name, and returns
// the holder's hold and the waiters, in line order. With n above NearAhead the last ones
// approach.
func farBack(ctx context.Context, t *testing.T, name string, n int, spec core.Spec) (*core.Hold, []pending) {
	t.Helper()
	admin := cluster.Client(t)
	hold, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	waiters := make([]pending, n)
	for i := range waiters {
		waiters[i] = enqueue(ctx, t, admin, name, spec, int64(i+2))
	}
	return hold, waiters
}

// drain releases hold, and then each waiter's hold once it is served, in line order.
func drain(ctx context.Context, t *testing.T, hold *core.Hold, waiters []pending) {
	t.Helper()
	for _, w := range waiters {
		_, err := hold.Release(ctx)
		require.NoError(t, err)
		hold = w.served(t)
	}
	_, err := hold.Release(ctx)
	require.NoError(t, err)
}

// TestAClientWithManyWaitersFarBackWatchesTheNameOnce queues many waiters on one client far
// back in line (a worker pool): the first approaches, the others share the client's one
// watch of the name, and the queue drains in order.
func TestAClientWithManyWaitersFarBackWatchesTheNameOnce(t *testing.T) {
	ctx := testContext(t)
	const name, n = "pool", 20
	admin := cluster.Client(t)
	hold, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	cli, cnt := countedClient(t)
	ahead := core.NearAhead() + 1 // on another client: each of cli's waiters is far back
	waiters := make([]pending, ahead+n)
	for i := range waiters {
		on := cli
		if i < ahead {
			on = admin
		}
		waiters[i] = enqueueOn(ctx, t, admin, on, name, exclusive, int64(i+2))
	}
	drain(ctx, t, hold, waiters)
	// The first approaches (a watch created and cancelled); the hub creates one (and may
	// cancel it) for the others.
	sent, bound := cnt.Counts()["Watch.send"], int64(4)
	t.Logf("%d waiters on one client: %d watch requests", n, sent)
	assert.LessOrEqual(t, sent, bound, "watch requests of %d waiters far back on one client", n)
}

// TestAFleetOfSmallPoolsHearsFewReleases queues a few waiters on each of many clients,
// spread over a long line (each client's waiters far apart): they approach as a fleet's
// do, and a release reaches few clients, not every client with a waiter left.
func TestAFleetOfSmallPoolsHearsFewReleases(t *testing.T) {
	ctx := testContext(t)
	const name, clients, pool = "small-pools", 32, 3
	admin := cluster.Client(t)
	hold, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	clis, counters := make([]*clientv3.Client, clients), make([]*rpcstat.Counter, clients)
	for i := range clis {
		clis[i], counters[i] = countedClient(t)
	}
	waiters := make([]pending, clients*pool)
	for i := range waiters {
		waiters[i] = enqueueOn(ctx, t, admin, clis[i%clients], name, exclusive, int64(i+2))
	}
	drain(ctx, t, hold, waiters)
	perRelease := float64(eventsHeard(counters)) / float64(len(waiters))
	bound := fewHearers()
	t.Logf("%d clients with %d waiters each: %.1f watch events heard per release", clients, pool, perRelease)
	assert.LessOrEqual(t, perRelease, bound, "a release reached about every client with a waiter left")
}

// fewHearers bounds the watch events a release may cost in a drained line: the near
// waiters' hubs, the hubs lingering after their turn, and a few approaching waiters.
func fewHearers() float64 { return float64(core.NearAhead() + core.LingerDeletes() + 3) }

// eventsHeard is the watch events the clients counted by counters received.
func eventsHeard(counters []*rpcstat.Counter) int64 {
	events := int64(0)
	for _, c := range counters {
		events += c.Counts()["Watch.events"]
	}
	return events
}

// TestAWaiterFarBackPassesAKeyAheadThatWithdrew cancels the waiter whose key the last one
// watches while it approaches: the last one goes on from there, and is served once every
// key ahead of it is gone, not before.
func TestAWaiterFarBackPassesAKeyAheadThatWithdrew(t *testing.T) {
	ctx := testContext(t)
	n := core.NearAhead() + 2
	admin := cluster.Client(t)
	hold, err := queue(t, admin, "withdrew").Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := enqueue(wctx, t, admin, "withdrew", exclusive, 2) // the key the last one watches
	var rest []pending
	for i := range n - 1 {
		rest = append(rest, enqueue(ctx, t, admin, "withdrew", exclusive, int64(i+3)))
	}
	cancel()
	r := <-first.result
	require.ErrorIs(t, r.err, context.Canceled)
	awaitCount(t, admin, "withdrew", int64(n))
	last := rest[len(rest)-1]
	for _, w := range rest {
		last.notYet(t, "the last waiter, with keys ahead")
		_, err := hold.Release(ctx)
		require.NoError(t, err)
		hold = w.served(t)
	}
	_, err = hold.Release(ctx)
	require.NoError(t, err)
}

// TestAWaiterFarBackEnds checks the ends of a waiter that approaches: its ctx ends (its key
// is removed), its lease is revoked (ErrLost, once the session learns it), its client
// closes (ErrLost), its key is deleted by hand (ErrLost, once the key it watches has gone).
func TestAWaiterFarBackEnds(t *testing.T) {
	ctx := testContext(t)
	n := core.NearAhead() + 1

	t.Run("ctx", func(t *testing.T) {
		hold, waiters := farBack(ctx, t, "far-ctx", n, exclusive)
		admin := cluster.Client(t)
		wctx, cancel := context.WithCancel(ctx)
		last := enqueue(wctx, t, admin, "far-ctx", exclusive, int64(n+2))
		cancel()
		r := <-last.result
		require.ErrorIs(t, r.err, context.Canceled)
		awaitCount(t, admin, "far-ctx", int64(n+1))
		drain(ctx, t, hold, waiters)
	})

	t.Run("session", func(t *testing.T) {
		hold, waiters := farBack(ctx, t, "far-session", n, exclusive)
		admin := cluster.Client(t)
		// Its own key is not watched: the session's next renewal (every third of the
		// TTL) finds the lease gone.
		q := queue(t, cluster.Client(t), "far-session", core.WithTTL(3*time.Second))
		last := pending{key: make(chan string, 1), result: make(chan outcome, 1)}
		go func() {
			h, err := q.Acquire(ctx, exclusive, func(k string) { last.key <- k })
			last.result <- outcome{h, err}
		}()
		awaitCount(t, admin, "far-session", int64(n+2))
		key := <-last.key
		_, err := admin.Revoke(ctx, leaseOf(t, admin, key))
		require.NoError(t, err)
		select {
		case r := <-last.result:
			require.ErrorIs(t, r.err, core.ErrLost)
		case <-time.After(20 * time.Second):
			t.Fatal("a waiter far back did not end with its lease")
		}
		drain(ctx, t, hold, waiters)
	})

	t.Run("client", func(t *testing.T) {
		hold, waiters := farBack(ctx, t, "far-client", n, exclusive)
		admin := cluster.Client(t)
		cli, cnt := countedClient(t)
		last := enqueueOn(ctx, t, admin, cli, "far-client", exclusive, int64(n+2))
		// Closed once it watches the key ahead: its enqueue has been answered.
		require.Eventually(t, func() bool { return cnt.Counts()["Watch.send"] > 0 }, 10*time.Second, time.Millisecond)
		require.NoError(t, cli.Close())
		select {
		case r := <-last.result:
			require.ErrorIs(t, r.err, core.ErrLost)
		case <-time.After(20 * time.Second):
			t.Fatal("a waiter far back did not end with its client")
		}
		// Its key stays until its lease expires: nothing can delete it through a closed
		// client. It is behind every other key; removed here for the next run of the test.
		_, err := admin.Delete(ctx, <-last.key)
		require.NoError(t, err)
		drain(ctx, t, hold, waiters)
	})

	t.Run("key", func(t *testing.T) {
		hold, waiters := farBack(ctx, t, "far-key", n, exclusive)
		admin := cluster.Client(t)
		last := enqueue(ctx, t, admin, "far-key", exclusive, int64(n+2))
		_, err := admin.Delete(ctx, <-last.key)
		require.NoError(t, err)
		drain(ctx, t, hold, waiters)
		select {
		case r := <-last.result:
			require.ErrorIs(t, r.err, core.ErrLost)
		case <-time.After(20 * time.Second):
			t.Fatal("a waiter far back whose key was deleted waited on")
		}
	})
}

// TestAReaderFarBackWaitsForWritersOnly queues a reader behind many writers: it approaches
// by the writers' keys, and is served once they are gone, with readers ahead still holding.
func TestAReaderFarBackWaitsForWritersOnly(t *testing.T) {
	ctx := testContext(t)
	const name = "far-reader"
	read, write := core.Spec{Kind: "r", Ahead: "w"}, core.Spec{Kind: "w"}
	admin := cluster.Client(t)
	r1, err := queue(t, admin, name).Acquire(ctx, read, nil)
	require.NoError(t, err)
	n := core.NearAhead() + 1
	writers := make([]pending, n)
	for i := range writers {
		writers[i] = enqueue(ctx, t, admin, name, write, int64(i+2))
	}
	reader := enqueue(ctx, t, admin, name, read, int64(n+2))
	_, err = r1.Release(ctx)
	require.NoError(t, err)
	for _, w := range writers {
		reader.notYet(t, "a reader with writers ahead")
		_, err := w.served(t).Release(ctx)
		require.NoError(t, err)
	}
	_, err = reader.served(t).Release(ctx)
	require.NoError(t, err)
}

// TestAFarWaiterKeepsItsClientsStream: a waiter that approaches ends its watches only once
// its hub's watch is on the client's stream, so the stream is not dropped and opened again:
// each waiting client opens one watch stream per acquisition. Ending the approach's watches first made every far waiter's client open
// a second stream (an RPC, and a stream in etcd, per hand-off of a fleet).
func TestAFarWaiterKeepsItsClientsStream(t *testing.T) {
	if cluster.External() {
		t.Skip("counts the streams of clients of its own; an external cluster's are namespaced")
	}
	ctx := testContext(t)
	const name = "far-stream"
	n := core.NearAhead() + 4
	admin := cluster.Client(t)
	hold, err := queue(t, admin, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	counters := make([]*rpcstat.Counter, n)
	waiters := make([]pending, n)
	for i := range waiters {
		counters[i] = &rpcstat.Counter{}
		cfg := cluster.ClientConfig()
		cfg.DialOptions = append(cfg.DialOptions, counters[i].DialOptions()...)
		cli, err := cluster.Open(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { cli.Close() })
		waiters[i] = enqueueOn(ctx, t, admin, cli, name, exclusive, int64(i+2))
	}
	// The far waiters have placed their approach's watch before the line moves: a waiter
	// whose read came after its predecessors went would be served by it, with no watch.
	for i := core.NearAhead(); i < n; i++ {
		deadline := time.Now().Add(10 * time.Second)
		for counters[i].Counts()["Watch.send"] < 1 {
			require.True(t, time.Now().Before(deadline), "waiter %d placed no watch", i)
			time.Sleep(5 * time.Millisecond) // polling a counter: no event to await
		}
	}
	drain(ctx, t, hold, waiters)
	for i := core.NearAhead(); i < n; i++ { // the waiters that approached
		assert.Equal(t, int64(1), counters[i].Counts()["Watch"], "watch streams the client of waiter %d opened", i)
	}
}
