package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
)

// TestStatusKnowsBarriersGatesAndLatches: a barrier's participants show as entered once
// their round filled and as waiting before, under a title with its size and round; a gate
// held shows as held; a latch shows its count; and a scan of the prefix finds all three,
// though a latch's and a gate's keys have no lease.
func TestStatusKnowsBarriersGatesAndLatches(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	opt := barrier.WithPrefix("gather-status/")
	var entered []*barrier.Barrier
	for range 2 {
		b, err := barrier.New(cluster.Client(t), "b", 2, opt)
		require.NoError(t, err)
		entered = append(entered, b)
	}
	errc := etcdtest.Async(func() error { return entered[0].Enter(ctx) })
	require.NoError(t, entered[1].Enter(ctx))
	require.NoError(t, etcdtest.Within(t, errc, 30*time.Second, "Enter"))
	waiting, err := barrier.New(cluster.Client(t), "b", 2, opt)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	werr := etcdtest.Async(func() error { return waiting.Enter(wctx) })
	etcdtest.AwaitKeys(t, cli, "gather-status/b/in/", 3)

	g, err := barrier.NewGate(cli, "g", opt)
	require.NoError(t, err)
	require.NoError(t, g.Hold(ctx))
	l, err := latch.New(cli, "l", latch.WithPrefix("gather-status/"))
	require.NoError(t, err)
	require.NoError(t, l.Set(ctx, 3))
	require.NoError(t, l.CountDownAs(ctx, "a"))

	for _, names := range [][]string{{"b", "g", "l"}, nil} {
		snap, err := admin.Status(ctx, cli, names, admin.Prefix("gather-status/"))
		require.NoError(t, err)
		require.Len(t, snap.Names, 3, "names %v", names)
		byName := map[string]admin.NameStatus{}
		for _, ns := range snap.Names {
			byName[ns.Name] = ns
		}
		b := byName["b"]
		assert.Equal(t, "barrier", b.Primitive)
		if assert.NotNil(t, b.Size) && assert.NotNil(t, b.Round) {
			assert.Equal(t, 2, *b.Size)
			assert.Equal(t, int64(2), *b.Round, "the round after the first")
		}
		var states []string
		for _, e := range b.Queue {
			assert.Equal(t, admin.KindParticipant, e.Kind)
			states = append(states, e.State)
		}
		assert.Equal(t, []string{admin.StateEntered, admin.StateEntered, admin.StateWaits}, states)
		gs := byName["g"]
		assert.Equal(t, "gate", gs.Primitive)
		if assert.Len(t, gs.Queue, 1) {
			assert.Equal(t, admin.KindGate, gs.Queue[0].Kind)
			assert.Equal(t, admin.StateHolds, gs.Queue[0].State)
		}
		ls := byName["l"]
		assert.Equal(t, "latch", ls.Primitive)
		assert.Empty(t, ls.Queue)
		if assert.NotNil(t, ls.Count) && assert.NotNil(t, ls.Size) {
			assert.Equal(t, 2, *ls.Count)
			assert.Equal(t, 3, *ls.Size)
		}
	}
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, werr, 30*time.Second, "the cancelled Enter"), context.Canceled)
	var left []<-chan error
	for _, b := range entered {
		left = append(left, etcdtest.Async(func() error { return b.Leave(ctx) }))
	}
	for _, errc := range left {
		assert.NoError(t, etcdtest.Within(t, errc, 30*time.Second, "Leave"))
	}
	require.NoError(t, g.Release(ctx))
	require.NoError(t, l.Delete(ctx))
	_, err = cli.Delete(ctx, "gather-status/", clientv3.WithPrefix())
	require.NoError(t, err)
}
