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
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var exclusive = core.Spec{}

func queue(t *testing.T, cli *clientv3.Client, name string, opts ...core.Option) *core.Queue {
	t.Helper()
	cfg, err := core.Options(opts)
	require.NoError(t, err)
	return core.NewQueue(cli, cfg, name)
}

func leaseOf(t *testing.T, cli *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(testContext(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

func TestPrimitivesOnOneClientAndTTLShareOneLease(t *testing.T) {
	ctx := testContext(t)
	cli, cnt := countedClient(t)
	other := cluster.Client(t)

	var holds []*core.Hold
	for _, q := range []*core.Queue{queue(t, cli, "share-a"), queue(t, cli, "share-b"), queue(t, cli, "share-c")} {
		h, err := q.Acquire(ctx, exclusive, nil)
		require.NoError(t, err)
		holds = append(holds, h)
	}
	lease := leaseOf(t, cli, holds[0].Key())
	for _, h := range holds[1:] {
		assert.Equal(t, lease, leaseOf(t, cli, h.Key()))
	}
	assert.Equal(t, int64(1), cnt.Counts()["LeaseGrant"], "more than one lease for one client and TTL")

	longer, err := queue(t, cli, "share-d", core.WithTTL(2*time.Minute)).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	onOther, err := queue(t, other, "share-e").Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	assert.NotEqual(t, lease, leaseOf(t, cli, longer.Key()), "another TTL shares the lease")
	assert.NotEqual(t, lease, leaseOf(t, cli, onOther.Key()), "another client shares the lease")

	for _, h := range append(holds, longer, onOther) {
		ended, err := h.Release(ctx)
		assert.True(t, ended)
		assert.NoError(t, err)
	}
}

func TestExpiredSessionIsReplacedForTheNextAcquisition(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	q := queue(t, cli, "replace", core.WithTTL(time.Second))
	h, err := q.Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	old := leaseOf(t, cli, h.Key())
	_, err = cli.Revoke(ctx, old)
	require.NoError(t, err)
	select {
	case <-h.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("hold did not end after its lease was revoked")
	}
	assert.ErrorIs(t, h.Err(), core.ErrLost)

	next, err := q.Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	assert.NotEqual(t, old, leaseOf(t, cli, next.Key()))
	_, err = next.Release(ctx)
	assert.NoError(t, err)
}

func TestReleaseTwiceEndsOnce(t *testing.T) {
	ctx := testContext(t)
	h, err := queue(t, cluster.Client(t), "twice").Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	ended, err := h.Release(ctx)
	assert.True(t, ended)
	assert.NoError(t, err)
	ended, err = h.Release(ctx)
	assert.False(t, ended)
	assert.ErrorIs(t, err, core.ErrNotLocked)
	assert.NoError(t, h.Err(), "a clean release is not a loss")
}

func TestSlotsAdmitThatManyHolders(t *testing.T) {
	ctx := testContext(t)
	spec := core.Spec{Capacity: 2}
	q := queue(t, cluster.Client(t), "slots")
	a, err := q.Acquire(ctx, spec, nil)
	require.NoError(t, err)
	b, err := q.Acquire(ctx, spec, nil)
	require.NoError(t, err)

	got := make(chan *core.Hold, 1)
	go func() {
		h, err := q.Acquire(ctx, spec, nil)
		assert.NoError(t, err)
		got <- h
	}()
	select {
	case <-got:
		t.Fatal("a third holder came in with two slots taken")
	case <-time.After(300 * time.Millisecond):
	}
	_, err = b.Release(ctx)
	require.NoError(t, err)
	c := <-got
	for _, h := range []*core.Hold{a, c} {
		_, err := h.Release(ctx)
		assert.NoError(t, err)
	}
}

func TestNamePrefixKeepsNamesApart(t *testing.T) {
	names := []string{"a", "a/b", "ab", "a/", "a%2Fb", "a%", "/"}
	seen := map[string]string{}
	for _, n := range names {
		p := core.NamePrefix(n)
		for other, op := range seen {
			assert.False(t, len(op) <= len(p) && p[:len(op)] == op, "%q's prefix %q holds %q's %q", other, op, n, p)
			assert.False(t, len(p) <= len(op) && op[:len(p)] == p, "%q's prefix %q holds %q's %q", n, p, other, op)
		}
		seen[n] = p
	}
	assert.Equal(t, "jobs/", core.NamePrefix("jobs"), "a plain name keeps etcd's layout")
}

func TestKeysAreReusedAndDistinctWhileLive(t *testing.T) {
	ctx := testContext(t)
	q := queue(t, cluster.Client(t), "reuse")
	first, err := q.Acquire(ctx, core.Spec{Capacity: 2}, nil)
	require.NoError(t, err)
	second, err := q.Acquire(ctx, core.Spec{Capacity: 2}, nil)
	require.NoError(t, err)
	assert.NotEqual(t, first.Key(), second.Key(), "two live acquisitions share a key")

	key := first.Key()
	_, err = first.Release(ctx)
	require.NoError(t, err)
	again, err := q.Acquire(ctx, core.Spec{Capacity: 2}, nil)
	require.NoError(t, err)
	assert.Equal(t, key, again.Key(), "a freed slot's key is not reused")
	assert.Greater(t, again.Token(), second.Token())
	for _, h := range []*core.Hold{second, again} {
		_, err := h.Release(ctx)
		assert.NoError(t, err)
	}
}

// nextKey returns the key q's next acquisition on cli will use and the lease it is bound to.
func nextKey(t *testing.T, cli *clientv3.Client, q *core.Queue) (string, clientv3.LeaseID) {
	t.Helper()
	ctx := testContext(t)
	probe, err := q.TryAcquire(ctx, exclusive)
	require.NoError(t, err)
	key, lease := probe.Key(), leaseOf(t, cli, probe.Key())
	_, err = probe.Release(ctx)
	require.NoError(t, err)
	return key, lease
}

// putLeftover writes key as a cleanup that could not reach etcd would have left it, and
// returns its create revision.
func putLeftover(t *testing.T, cli *clientv3.Client, key string, lease clientv3.LeaseID) int64 {
	t.Helper()
	put, err := cli.Put(testContext(t), key, "", clientv3.WithLease(lease))
	require.NoError(t, err)
	return put.Header.Revision
}

func TestALeftoverOwnKeyWithNothingAheadIsTakenOver(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	q := queue(t, cli, "leftover-first")
	for _, try := range []bool{false, true} {
		key, lease := nextKey(t, cli, q)
		rev := putLeftover(t, cli, key, lease)
		var h *core.Hold
		var err error
		if try {
			h, err = q.TryAcquire(ctx, exclusive)
		} else {
			h, err = q.Acquire(ctx, exclusive, nil)
		}
		require.NoError(t, err)
		assert.Equal(t, key, h.Key())
		assert.Equal(t, rev, h.Token(), "not the leftover key's place in line")
		_, err = h.Release(ctx)
		require.NoError(t, err)
	}
}

func TestTryAcquireRemovesALeftoverOwnKeyBehindAnother(t *testing.T) {
	ctx := testContext(t)
	cli := cluster.Client(t)
	q := queue(t, cli, "leftover-behind")
	key, lease := nextKey(t, cli, q)
	holder, err := queue(t, cluster.Client(t), "leftover-behind").Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	require.Greater(t, putLeftover(t, cli, key, lease), holder.Token())

	_, err = q.TryAcquire(ctx, exclusive)
	assert.ErrorIs(t, err, core.ErrLocked)
	resp, err := cli.Get(ctx, key)
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "the leftover key behind the holder is still queued")
	_, err = holder.Release(ctx)
	require.NoError(t, err)
}

// TestDefaultTTLIsTheDocumentedOne: every package's DefaultTTL doc says 60 s.
func TestDefaultTTLIsTheDocumentedOne(t *testing.T) {
	assert.Equal(t, 60*time.Second, core.DefaultTTL)
}
