package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestAClientSpreadsItsHoldsOverLeases: with at most 3 keys a lease, 7 holds of one client
// and TTL are on 3 leases (3, 3, 1); revoking one of them loses its holds alone, and the
// others are released as ever, leaving no key.
func TestAClientSpreadsItsHoldsOverLeases(t *testing.T) {
	defer core.SetMaxLeaseKeys(3)()
	ctx := testContext(t)
	cli, admin := cluster.Client(t), cluster.Client(t)
	var holds []*core.Hold
	byLease := map[clientv3.LeaseID][]*core.Hold{}
	for i := range 7 {
		h, err := queue(t, cli, "spread-"+string(rune('a'+i))).Acquire(ctx, exclusive, nil)
		require.NoError(t, err)
		holds = append(holds, h)
		l := leaseOf(t, admin, h.Key())
		byLease[l] = append(byLease[l], h)
	}
	var sizes []int
	for _, hs := range byLease {
		sizes = append(sizes, len(hs))
	}
	assert.ElementsMatch(t, []int{3, 3, 1}, sizes, "keys per lease")

	first := leaseOf(t, admin, holds[0].Key())
	_, err := admin.Revoke(ctx, first)
	require.NoError(t, err)
	for _, h := range byLease[first] {
		assert.Zero(t, leaseOfOr0(t, admin, h.Key()), "a key of the revoked lease is left")
	}
	for _, h := range byLease[first] {
		etcdtest.Within(t, h.Done(), 10*time.Second, "a hold of the revoked lease")
		assert.ErrorIs(t, h.Err(), core.ErrLost)
	}
	for _, h := range holds {
		if leaseOfOr0(t, admin, h.Key()) == 0 {
			continue
		}
		alive, err := h.Check(ctx)
		require.NoError(t, err)
		assert.True(t, alive, "a hold of another lease")
		_, err = h.Release(ctx)
		require.NoError(t, err)
	}
	assert.Zero(t, etcdtest.CountKeys(t, admin, "spread-"))
}

func leaseOfOr0(t *testing.T, cli *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(testContext(t), key)
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return 0
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}
