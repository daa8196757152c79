package latch_test

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

// TestAWriteWhoseAnswerNeverComesIsTriedAgain: a Set whose answer never comes (etcd applied
// it; a connection that died silently), and a Delete that never reached etcd, are tried
// again once a try's bound passes, and return long before their ctx ends (they held the
// call until then: the barrier and latch explorer, seed 3, failed on it in CI).
func TestAWriteWhoseAnswerNeverComesIsTriedAgain(t *testing.T) {
	const name = "answer-never-comes"
	fresh(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	inj := &etcdtest.Injector{}
	l := newLatch(t, inj.Client(t, cluster), name)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Drop, Times: 1})
	require.NoError(t, l.Set(ctx, 2), "the retry finds its own Set")
	n, err := l.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.NamePrefix(name)), Action: etcdtest.Lose, Times: 1})
	require.NoError(t, l.Delete(ctx))
	resp, err := cluster.Client(t).Get(ctx, latchKeys(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	assert.Zero(t, resp.Count, "the latch is deleted")
	assert.NoError(t, ctx.Err(), "both returned before ctx ended")
}
