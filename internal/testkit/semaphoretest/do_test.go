package semaphore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/semaphore"
)

// TestDoGivesFnItsPermit: inside Do, PermitOf(fn's ctx) is the permit of n units that Do
// holds, whose IsOwner fences a write; outside Do, and for another Semaphore, it is nil.
func TestDoGivesFnItsPermit(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	s, err := semaphore.New(cli, "do-permit", 4)
	require.NoError(t, err)
	other, err := semaphore.New(cli, "do-permit-other", 4)
	require.NoError(t, err)
	assert.Nil(t, s.PermitOf(ctx))
	err = s.Do(ctx, 3, func(ctx context.Context) error {
		p := s.PermitOf(ctx)
		require.NotNil(t, p)
		assert.Equal(t, 3, p.Units())
		assert.Nil(t, other.PermitOf(ctx))
		resp, err := cli.Txn(ctx).If(p.IsOwner()).Then(clientv3.OpPut("do-permit-fenced", "x")).Commit()
		require.NoError(t, err)
		assert.True(t, resp.Succeeded, "the permit's fence refused a write inside Do")
		return nil
	})
	require.NoError(t, err)
	_, err = cli.Delete(ctx, "do-permit-fenced")
	require.NoError(t, err)
}
