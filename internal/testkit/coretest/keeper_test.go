package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// handedOn returns a hold of name served to a waiter on a client of its own (cli, whose
// RPCs cnt counts) when another client's holder released, with its loss watched (Done).
func handedOn(t *testing.T, name string) (h *core.Hold, cli *clientv3.Client, watches func() int64) {
	return handedOnIn(t, cluster, name)
}

// handedOnIn is handedOn on the cluster c.
func handedOnIn(t *testing.T, c *etcdtest.Cluster, name string) (h *core.Hold, cli *clientv3.Client, watches func() int64) {
	t.Helper()
	cli, cnt := countedClientOf(t, c)
	return handedOnVia(t, c.Client(t), cli, c.Client(t), name), cli, func() int64 { return cnt.Counts()["Watch.send"] }
}

// handedOnVia returns a hold of name served to a waiter on client to when a holder on
// client from released, with its loss watched (Done); admin sees both keys first.
func handedOnVia(t *testing.T, from, to, admin *clientv3.Client, name string) *core.Hold {
	t.Helper()
	ctx := testContext(t)
	first, err := queue(t, from, name).Acquire(ctx, exclusive, nil)
	require.NoError(t, err)
	got := acquireAsync(ctx, queue(t, to, name), exclusive)
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 2)
	_, err = first.Release(ctx)
	require.NoError(t, err)
	select {
	case h := <-got:
		require.NotNil(t, h, "the waiter failed")
		h.Done()
		return h
	case <-ctx.Done():
		t.Fatal("the waiter was not served")
		return nil
	}
}

// TestAHoldServedThroughItsHubHearsItsLossThere: a waiter served while its client's hub of
// the name lingers has its loss watched by that hub, with no watch created for it, and is
// told of its key's delete by another client, and of its lease's end, as any hold is; once
// released, the hub closes as it would have.
func TestAHoldServedThroughItsHubHearsItsLossThere(t *testing.T) {
	if cluster.External() {
		t.Skip("a client of an external cluster is confined (its KV and Watcher wrapped): its holds are watched through its Watcher, one watch each, never by a hub")
	}
	t.Run("deleted", func(t *testing.T) {
		const name = "heard-by-hub-deleted"
		h, _, watches := handedOn(t, name)
		assert.True(t, core.HeardByHub(h), "the hold's loss is watched on its own")
		assert.Equal(t, int64(1), watches(), "watch requests sent: the hub's, and one for the hold")
		deleteAndAwait(t, cluster.Client(t), h, "the hold's Done after its key's delete")
		_, err := h.Release(testContext(t))
		assert.ErrorIs(t, err, core.ErrLost)
	})
	t.Run("lease", func(t *testing.T) {
		const name = "heard-by-hub-lease"
		h, _, _ := handedOn(t, name)
		require.True(t, core.HeardByHub(h))
		_, err := cluster.Client(t).Revoke(testContext(t), h.Lease())
		require.NoError(t, err)
		etcdtest.Within(t, h.Done(), lossNews, "the hold's Done after its lease's revoke")
		assert.ErrorIs(t, h.Err(), core.ErrLost)
	})
	t.Run("released", func(t *testing.T) {
		const name = "heard-by-hub-released"
		h, cli, _ := handedOn(t, name)
		require.True(t, core.HeardByHub(h))
		ended, err := h.Release(testContext(t))
		require.NoError(t, err)
		assert.True(t, ended)
		assert.NoError(t, h.Err())
		assert.False(t, core.HeardByHub(h))
		require.Eventually(t, func() bool { return !core.HasHub(cli, name) }, lossNews, 10*time.Millisecond,
			"the hub of a released hold's name does not close")
	})
}

// TestAHoldHeardByItsHubAcrossACompactionAndARestartIsToldOfItsDelete: the hub of a hold it
// watches loses its history (compacted, then its member restarted): it reads the name
// again, and a delete of the hold's key after that still reaches the hold.
func TestAHoldHeardByItsHubAcrossACompactionAndARestartIsToldOfItsDelete(t *testing.T) {
	onEachSetup(t, func(t *testing.T, s setup) {
		if s.confine {
			t.Skip("a confined client's holds are watched through its Watcher, never by a hub")
		}
		h, _, _ := handedOnIn(t, s.c, "heard-by-hub-compacted")
		require.True(t, core.HeardByHub(h))
		admin := s.c.Client(t)
		loseHistory(t, s.c, admin)
		deleteAndAwait(t, admin, h, "the hold's Done after its key's delete")
	})
}

// TestAHoldHeardByItsHubOnAFollowerIsToldOfItsLoss: three members; the holder's client on
// the leader, the waiter's on a follower, the client that deletes on the third member. The
// hold the waiter's hub heard served is watched by that hub, through the follower; after
// the follower restarts under it, a delete of its key by the other member's client still
// reaches it; a second such hold is told of its lease's revoke.
func TestAHoldHeardByItsHubOnAFollowerIsToldOfItsLoss(t *testing.T) {
	etcdtest.OwnMembers(t)
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	leader, err := c.Leader(testContext(t))
	require.NoError(t, err)
	follower, third := (leader+1)%3, (leader+2)%3
	admin := etcdtest.ClientOf(t, c.MemberEndpoint(third))
	served := func(name string) *core.Hold {
		t.Helper()
		h := handedOnVia(t, etcdtest.ClientOf(t, c.MemberEndpoint(leader)), etcdtest.ClientOf(t, c.MemberEndpoint(follower)), admin, name)
		require.True(t, core.HeardByHub(h), "the served hold's loss is watched by its hub")
		return h
	}

	h := served("heard-on-a-follower-deleted")
	c.Stop(follower)
	require.NoError(t, c.Restart(follower))
	deleteAndAwait(t, admin, h, "the hold's Done after its key's delete on another member")

	h = served("heard-on-a-follower-revoked")
	_, err = admin.Revoke(testContext(t), h.Lease())
	require.NoError(t, err)
	etcdtest.Within(t, h.Done(), lossNews, "the hold's Done after its lease's revoke on another member")
	assert.ErrorIs(t, h.Err(), core.ErrLost)
}

// TestAHoldHeardByItsHubIsToldOfItsDeleteWhenTheHubsReadGetsNoAnswer: the hub of a hold it
// watches loses its history (compacted, then its member restarted) and reads the name
// again; that read's answer never comes (the injector loses it). The read is tried again
// once its try's bound passes, and a delete of the hold's key meanwhile reaches the hold.
func TestAHoldHeardByItsHubIsToldOfItsDeleteWhenTheHubsReadGetsNoAnswer(t *testing.T) {
	const name = "heard-by-hub-unanswered"
	c, inj, admin, h := heardOnInjected(t, name)
	lost := make(chan struct{}, 1)
	inj.Add(etcdtest.Rule{Method: "Range", Action: etcdtest.Lose, Times: 1, Match: readsName(name),
		Matched: func() { lost <- struct{}{} }})
	loseHistory(t, c, admin)
	etcdtest.Within(t, lost, lossNews, "the hub's read of the name, whose answer is lost")
	deleteAndAwait(t, admin, h, "the hold's Done after its key's delete")
}

// TestAHoldItsHubFailsIsToldOfADeleteMadeBeforeItsOwnWatchIsCreated: the hub of a hold it
// watches loses its history and its read of the name is refused, so the hub hands the key
// to the client's key watch, whose stream cannot open yet (the injector holds every new
// watch stream). The key is deleted meanwhile; once the stream opens, the key's watch,
// created from the revision after the key's creation, tells the hold of the delete.
func TestAHoldItsHubFailsIsToldOfADeleteMadeBeforeItsOwnWatchIsCreated(t *testing.T) {
	const name = "heard-by-hub-refused"
	c, inj, admin, h := heardOnInjected(t, name)
	open, held := make(chan struct{}), make(chan struct{}, 1)
	t.Cleanup(func() {
		select {
		case <-open:
		default:
			close(open)
		}
	})
	inj.Add(etcdtest.Rule{Method: "Range", Action: etcdtest.Refuse, Times: 1, Match: readsName(name),
		Matched: func() {
			inj.Add(etcdtest.Rule{Method: "Watch", Action: etcdtest.Hold, Until: open,
				Matched: func() {
					select {
					case held <- struct{}{}:
					default:
					}
				}})
		}})
	loseHistory(t, c, admin)
	require.Eventually(t, func() bool { return !core.HeardByHub(h) }, lossNews, 10*time.Millisecond,
		"the hub whose read was refused still watches the hold's key")
	etcdtest.Within(t, held, lossNews, "a watch stream opened for the hold's key")

	_, err := admin.Delete(testContext(t), h.Key())
	require.NoError(t, err)
	select {
	case <-h.Done():
		t.Fatal("the hold was told of its key's delete with no watch of it in place")
	default:
	}
	close(open)
	etcdtest.Within(t, h.Done(), lossNews, "the hold's Done once its key's watch is created")
	assert.ErrorIs(t, h.Err(), core.ErrLost)
}

// heardOnInjected starts a cluster of one member of its own and returns a hold of name
// served, and watched, by the hub of a client on it that inj disturbs; admin is another
// client, undisturbed.
func heardOnInjected(t *testing.T, name string) (c *etcdtest.Cluster, inj *etcdtest.Injector, admin *clientv3.Client, h *core.Hold) {
	t.Helper()
	etcdtest.OwnMembers(t)
	c, err := etcdtest.NewEmbedded(1)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	inj, admin = &etcdtest.Injector{}, c.Client(t)
	h = handedOnVia(t, admin, inj.Client(t, c), admin, name)
	require.True(t, core.HeardByHub(h), "the served hold's loss is watched by its hub")
	return c, inj, admin, h
}

// readsName matches a read of every key of name (a hub's).
func readsName(name string) func(any) bool {
	return func(req any) bool {
		r, ok := req.(*pb.RangeRequest)
		return ok && string(r.Key) == core.NamePrefix(name)
	}
}

// loseHistory makes the watches of c's member 0 lose their history: it compacts past the
// revision after a hub's last event (where its watch resumes), then restarts the member.
func loseHistory(t *testing.T, c *etcdtest.Cluster, admin *clientv3.Client) {
	t.Helper()
	compactPast(t, admin)
	compactPast(t, admin)
	c.Stop(0)
	require.NoError(t, c.Restart(0))
}

// deleteAndAwait deletes h's key through admin and checks that h is told, as a loss.
func deleteAndAwait(t *testing.T, admin *clientv3.Client, h *core.Hold, what string) {
	t.Helper()
	_, err := admin.Delete(testContext(t), h.Key())
	require.NoError(t, err)
	etcdtest.Within(t, h.Done(), lossNews, what)
	assert.ErrorIs(t, h.Err(), core.ErrLost)
}
