package barrier_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

func newGate(t *testing.T, cli *clientv3.Client, name string) *barrier.Gate {
	t.Helper()
	g, err := barrier.NewGate(cli, name)
	require.NoError(t, err)
	return g
}

// TestGate: waiters on several clients wait while the gate is held and all pass at its
// release; Hold and Release are idempotent.
func TestGate(t *testing.T) {
	ctx := testContext(t)
	const name = "gate"
	fresh(t, name)
	holder := newGate(t, cluster.Client(t), name)
	require.NoError(t, holder.Hold(ctx))
	require.NoError(t, holder.Hold(ctx), "held again")
	var waits []<-chan error
	for range 3 {
		g := newGate(t, cluster.Client(t), name)
		waits = append(waits, etcdtest.Async(func() error { return g.Wait(ctx) }))
	}
	for i, w := range waits {
		etcdtest.Pending(t, w, fmt.Sprintf("waiter %d", i))
	}
	require.NoError(t, newGate(t, cluster.Client(t), name).Release(ctx))
	for i, w := range waits {
		require.NoError(t, etcdtest.Within(t, w, returns, fmt.Sprintf("waiter %d", i)))
	}
	require.NoError(t, holder.Release(ctx), "released again")
}

// TestAGateWaitAfterTheReleaseReturns: a wait that begins after the release returns at
// once, after the revision moved on and history was compacted (etcd's Barrier.Wait kept
// blocking then, PR #16223).
func TestAGateWaitAfterTheReleaseReturns(t *testing.T) {
	etcdtest.OwnMembers(t) // a compaction would cut other packages' watches short
	ctx := testContext(t)
	const name = "gate-after"
	fresh(t, name)
	cli := cluster.Client(t)
	g := newGate(t, cli, name)
	require.NoError(t, g.Hold(ctx))
	require.NoError(t, g.Release(ctx))
	for i := range 10 {
		_, err := cli.Put(ctx, fmt.Sprintf("gate-other/%d", i), "x")
		require.NoError(t, err)
	}
	_, err := cli.Compact(ctx, etcdtest.Revision(t, cli), clientv3.WithCompactPhysical())
	require.NoError(t, err)
	require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return newGate(t, cluster.Client(t), name).Wait(ctx) }), 10*time.Second, "a wait after the release"))
	_, err = cli.Delete(ctx, "gate-other/", clientv3.WithPrefix())
	require.NoError(t, err)
}

// TestGateBadInput: bad names and options are refused; a Gate not made by NewGate refuses
// every call; a timed-out wait writes nothing.
func TestGateBadInput(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	_, err := barrier.NewGate(cli, "")
	assert.ErrorIs(t, err, barrier.ErrInvalidName)
	_, err = barrier.NewGate(nil, "x")
	assert.ErrorIs(t, err, barrier.ErrInvalidOption)
	_, err = barrier.NewGate(cli, "x", etcdsync.WithTTL(5*time.Second))
	assert.ErrorIs(t, err, barrier.ErrInvalidOption)
	var zero barrier.Gate
	var none *barrier.Gate
	for _, u := range []*barrier.Gate{&zero, none} {
		assert.ErrorIs(t, u.Hold(ctx), barrier.ErrInvalidOption)
		assert.ErrorIs(t, u.Release(ctx), barrier.ErrInvalidOption)
		assert.ErrorIs(t, u.Wait(ctx), barrier.ErrInvalidOption)
	}
	const name = "gate-bad"
	fresh(t, name)
	require.NoError(t, newGate(t, cli, name).Hold(ctx))
	since := etcdtest.Revision(t, cli)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, newGate(t, cluster.Client(t), name).Wait(wctx), context.DeadlineExceeded)
	etcdtest.NoWrites(t, cli, since, "a timed-out wait")
	require.NoError(t, newGate(t, cli, name).Release(ctx))
}
