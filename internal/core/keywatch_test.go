package core_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// lossNews is how long a deleted hold may take to be told: a second or two on an idle
// machine, far more on a loaded one; a hold never told fails all the same.
const lossNews = 15 * time.Second

// onEachServer runs test on a member of its own, embedded, and as an etcd server process
// when there is one (etcdtest.ServerBinary): these tests compact, restart and change the
// auth store, which a shared or external cluster must not see.
func onEachServer(t *testing.T, test func(t *testing.T, c *etcdtest.Cluster)) {
	servers := []struct {
		name  string
		start func() (*etcdtest.Cluster, error)
	}{
		{"embedded", func() (*etcdtest.Cluster, error) { return etcdtest.NewEmbedded(1) }},
		{"process", func() (*etcdtest.Cluster, error) {
			if etcdtest.ServerBinary() == "" {
				return nil, nil
			}
			return etcdtest.NewProcesses(1, etcdtest.ServerBinary())
		}},
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			c, err := s.start()
			require.NoError(t, err)
			if c == nil {
				t.Skip("no etcd server binary (etcd on PATH or $ETCDTEST_ETCD)")
			}
			t.Cleanup(c.Close)
			test(t, c)
		})
	}
}

// compactPast writes a key and compacts, physically, to its revision: every watch from an
// earlier revision is then cancelled by etcd.
func compactPast(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx := testContext(t)
	resp, err := cli.Put(ctx, "keywatch-test/filler", "x")
	require.NoError(t, err)
	_, err = cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	require.NoError(t, err)
}

// acquireHolds takes n holds on names of their own through cli.
func acquireHolds(t *testing.T, cli *clientv3.Client, n int) []*core.Hold {
	t.Helper()
	holds := make([]*core.Hold, n)
	for i := range holds {
		h, err := queue(t, cli, fmt.Sprintf("keywatch-%d", i)).Acquire(testContext(t), exclusive, nil)
		require.NoError(t, err)
		holds[i] = h
	}
	return holds
}

// deleteAndAwaitLoss deletes the key of every hold of cli through admin, once every watch
// of cli is in place (else the read of a cancelled watch may find the delete), and checks
// that each hold is told, as a loss.
func deleteAndAwaitLoss(t *testing.T, cli, admin *clientv3.Client, holds []*core.Hold) {
	t.Helper()
	require.Eventually(t, func() bool { return core.KeyWatchPlaced(cli) }, lossNews, 10*time.Millisecond,
		"the watches of the holds were never placed")
	for _, h := range holds {
		_, err := admin.Delete(testContext(t), h.Key())
		require.NoError(t, err)
	}
	for i, h := range holds {
		etcdtest.Within(t, h.Done(), lossNews, fmt.Sprintf("the Done of deleted hold %d of %d", i+1, len(holds)))
		assert.ErrorIs(t, h.Err(), core.ErrLost)
	}
}

func TestAHoldFirstWatchedAfterACompactionIsToldOfItsDelete(t *testing.T) {
	onEachServer(t, func(t *testing.T, c *etcdtest.Cluster) {
		cli, admin := c.Client(t), c.Client(t)
		holds := acquireHolds(t, cli, 3)
		compactPast(t, admin)
		for _, h := range holds {
			_ = h.Done() // the watch starts now, from a compacted revision
		}
		deleteAndAwaitLoss(t, cli, admin, holds)
	})
}

func TestHoldsWatchedAcrossARestartAfterACompactionAreToldOfTheirDelete(t *testing.T) {
	onEachServer(t, func(t *testing.T, c *etcdtest.Cluster) {
		cli, admin := c.Client(t), c.Client(t)
		holds := acquireHolds(t, cli, 20)
		for _, h := range holds {
			_ = h.Done()
		}
		compactPast(t, admin)
		c.Stop(0) // the stream is cut; every watch is created again from its token + 1
		require.NoError(t, c.Restart(0))
		deleteAndAwaitLoss(t, cli, admin, holds)
	})
}

// jwtCluster starts one embedded member whose auth tokens are JWTs, with auth on, and
// returns it with a client of a user who may write every key, and one of root.
func jwtCluster(t *testing.T) (c *etcdtest.Cluster, cli, admin *clientv3.Client) {
	t.Helper()
	c, err := etcdtest.NewEmbedded(1, etcdtest.WithJWT())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.NoError(t, c.EnableAuth(testContext(t), etcdtest.Grants{"app": {""}}))
	return c, c.ClientWithPassword(t, "app"), c.Client(t)
}

// changeAuth adds a user: a change to etcd's auth store, which makes every JWT issued
// before it old.
func changeAuth(t *testing.T, admin *clientv3.Client) {
	t.Helper()
	name := make([]byte, 4)
	_, _ = rand.Read(name)
	_, err := admin.UserAdd(testContext(t), "user-"+hex.EncodeToString(name), "pw")
	require.NoError(t, err)
}

func TestAHoldWatchedAfterAnAuthChangeIsToldOfItsDelete(t *testing.T) {
	_, cli, admin := jwtCluster(t)
	first := acquireHolds(t, cli, 1)[0]
	_ = first.Done() // the client's key watch stream is open, with the token of now
	changeAuth(t, admin)
	later, err := queue(t, cli, "keywatch-later").Acquire(testContext(t), exclusive, nil)
	require.NoError(t, err) // a fresh token for cli's unary calls; the stream keeps its old one
	_ = later.Done()
	deleteAndAwaitLoss(t, cli, admin, []*core.Hold{later, first})
}

func TestHoldsWatchedAcrossARestartAfterAnAuthChangeAreToldOfTheirDelete(t *testing.T) {
	c, cli, admin := jwtCluster(t)
	holds := acquireHolds(t, cli, 5)
	for _, h := range holds {
		_ = h.Done()
	}
	changeAuth(t, admin) // cli learns of it only when etcd refuses its token
	c.Stop(0)            // the stream is opened again, with whatever token cli has then
	require.NoError(t, c.Restart(0))
	deleteAndAwaitLoss(t, cli, admin, holds)
}
