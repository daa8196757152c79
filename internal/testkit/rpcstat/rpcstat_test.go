package rpcstat_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// TestCallsCountAsTheirCtxsAndKeys: a call counts under the label of its ctx, also on a
// child or a detached copy of it, and under the tracked prefixes of the keys it names
// (behind the client's namespace); other calls of the client count in neither.
func TestCallsCountAsTheirCtxsAndKeys(t *testing.T) {
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	mine := cluster.Prefix() + "mine/"
	cnt.Track(mine)

	own := rpcstat.WithLabel(ctx, "own")
	_, err := cli.Put(own, "mine/a", "1")
	require.NoError(t, err)
	child, cancel := context.WithCancel(clientv3.WithRequireLeader(own))
	defer cancel()
	_, err = cli.Get(child, "other/b")
	require.NoError(t, err)
	_, err = cli.Txn(context.WithoutCancel(own)).
		If(clientv3.Compare(clientv3.Version("other/c"), "=", 0)).
		Then(clientv3.OpDelete("mine/a")).Commit()
	require.NoError(t, err)
	_, err = cli.Get(ctx, "mine/a") // not labelled
	require.NoError(t, err)
	_, err = cli.Get(rpcstat.WithLabel(ctx, "another"), "other/d")
	require.NoError(t, err)
	wctx, stop := context.WithCancel(own)
	wch := cli.Watch(wctx, "mine/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch // created
	stop()

	assert.Equal(t, rpcstat.Counts{"Put": 1, "Range": 1, "Txn": 1}, cnt.Labelled("own"), "the calls on own, its child and its detached copy")
	assert.Equal(t, rpcstat.Counts{"Range": 1}, cnt.Labelled("another"))
	assert.Empty(t, cnt.Labelled("none"))
	under := cnt.Under(mine)
	assert.Equal(t, int64(1), under["Put"])
	assert.Equal(t, int64(1), under["Txn"], "a Txn that deletes a key under the prefix")
	assert.Equal(t, int64(1), under["Range"], "the unlabelled read; not the reads of other keys")
	assert.Equal(t, int64(1), under["Watch.send"], "the watch's create, not its cancel")
	assert.Empty(t, cnt.Under("untracked/"))
	assert.Equal(t, int64(3), cnt.Counts()["Range"], "every read of the client")
}

// TestWatchEventsCountEveryEventReceived: the events a client's watches receive count as
// Watch.events, one per event, several in one response included; a created notice is none.
func TestWatchEventsCountEveryEventReceived(t *testing.T) {
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wch := cli.Watch(wctx, "events/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch // created
	_, err := cli.Txn(ctx).Then(clientv3.OpPut("events/a", "1"), clientv3.OpPut("events/b", "1")).Commit()
	require.NoError(t, err)
	_, err = cli.Delete(ctx, "events/", clientv3.WithPrefix())
	require.NoError(t, err)
	for seen := 0; seen < 4; {
		wr := <-wch
		require.NoError(t, wr.Err())
		seen += len(wr.Events)
	}
	assert.Equal(t, int64(4), cnt.Counts()["Watch.events"])
}
