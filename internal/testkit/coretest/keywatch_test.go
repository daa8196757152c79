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

// A setup is a member of its own and how its holds are watched: on the client's own key
// watch, or (confined: a client whose KV and Watcher are wrapped, as on every external
// cluster) through the client's Watcher, one watch per hold.
type setup struct {
	c       *etcdtest.Cluster
	confine bool
}

// confinement is the namespace of a confined setup's clients.
const confinement = "confined/"

// client opens a client whose holds are watched as s says.
func (s setup) client(t *testing.T) *clientv3.Client {
	cli := s.c.Client(t)
	if s.confine {
		etcdtest.Confine(cli, confinement)
	}
	return cli
}

// onEachSetup runs test on a member of its own, embedded, and as an etcd server process
// when there is one (etcdtest.ServerBinary), with holds watched either way: these tests
// compact, restart and change the auth store, which a shared or external cluster must not
// see.
func onEachSetup(t *testing.T, test func(t *testing.T, s setup)) { onEachSetupOf(t, nil, test) }

// onEachSetupOf is onEachSetup on members started with opts.
func onEachSetupOf(t *testing.T, opts []etcdtest.Option, test func(t *testing.T, s setup)) {
	etcdtest.OwnMembers(t)
	servers := []struct {
		name  string
		start func() (*etcdtest.Cluster, error)
	}{
		{"embedded", func() (*etcdtest.Cluster, error) { return etcdtest.NewEmbedded(1, opts...) }},
		{"process", func() (*etcdtest.Cluster, error) {
			if etcdtest.ServerBinary() == "" {
				return nil, nil
			}
			return etcdtest.NewProcesses(1, etcdtest.ServerBinary(), opts...)
		}},
	}
	for _, srv := range servers {
		for _, confine := range []bool{false, true} {
			name := srv.name + "/keywatch"
			if confine {
				name = srv.name + "/confined"
			}
			t.Run(name, func(t *testing.T) {
				c, err := srv.start()
				require.NoError(t, err)
				if c == nil {
					t.Skip("no etcd server binary (etcd on PATH or $ETCDTEST_ETCD)")
				}
				t.Cleanup(c.Close)
				test(t, setup{c: c, confine: confine})
			})
		}
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

// deleteAndAwaitLoss deletes the key of every hold of cli through admin (a client that is
// not confined) and checks that each hold is told, as a loss. On cli's own key watch it
// deletes once every watch is in place, else the read of a cancelled watch may find the
// delete; a confined client's watches say nothing of that.
func deleteAndAwaitLoss(t *testing.T, s setup, cli, admin *clientv3.Client, holds []*core.Hold) {
	t.Helper()
	prefix := ""
	if s.confine {
		prefix = confinement
	} else {
		require.Eventually(t, func() bool { return core.KeyWatchPlaced(cli) }, lossNews, 10*time.Millisecond,
			"the watches of the holds were never placed")
	}
	for _, h := range holds {
		_, err := admin.Delete(testContext(t), prefix+h.Key())
		require.NoError(t, err)
	}
	for i, h := range holds {
		etcdtest.Within(t, h.Done(), lossNews, fmt.Sprintf("the Done of deleted hold %d of %d", i+1, len(holds)))
		assert.ErrorIs(t, h.Err(), core.ErrLost)
	}
}

func TestAHoldFirstWatchedAfterACompactionIsToldOfItsDelete(t *testing.T) {
	onEachSetup(t, func(t *testing.T, s setup) {
		cli, admin := s.client(t), s.c.Client(t)
		holds := acquireHolds(t, cli, 3)
		compactPast(t, admin)
		for _, h := range holds {
			_ = h.Done() // the watch starts now, from a compacted revision
		}
		deleteAndAwaitLoss(t, s, cli, admin, holds)
	})
}

func TestHoldsWatchedAcrossARestartAfterACompactionAreToldOfTheirDelete(t *testing.T) {
	onEachSetup(t, func(t *testing.T, s setup) {
		cli, admin := s.client(t), s.c.Client(t)
		holds := acquireHolds(t, cli, 20)
		for _, h := range holds {
			_ = h.Done()
		}
		compactPast(t, admin)
		s.c.Stop(0) // the stream is cut; every watch is created again from its token + 1
		require.NoError(t, s.c.Restart(0))
		deleteAndAwaitLoss(t, s, cli, admin, holds)
	})
}

// onEachJWTSetup runs test on a member of its own whose auth tokens are JWTs, with auth on,
// embedded and as an etcd server process when there is one, with holds watched either way
// (see setup); it passes a client of a user who may write every key and one of root.
func onEachJWTSetup(t *testing.T, test func(t *testing.T, s setup, cli, admin *clientv3.Client)) {
	onEachSetupOf(t, []etcdtest.Option{etcdtest.WithJWT()}, func(t *testing.T, s setup) {
		require.NoError(t, s.c.EnableAuth(testContext(t), etcdtest.Grants{"app": {""}}))
		cli := s.c.ClientWithPassword(t, "app")
		if s.confine {
			etcdtest.Confine(cli, confinement)
		}
		test(t, s, cli, s.c.Client(t))
	})
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
	onEachJWTSetup(t, func(t *testing.T, s setup, cli, admin *clientv3.Client) {
		first := acquireHolds(t, cli, 1)[0]
		_ = first.Done() // the client's watch stream is open, with the token of now
		changeAuth(t, admin)
		later, err := queue(t, cli, "keywatch-later").Acquire(testContext(t), exclusive, nil)
		require.NoError(t, err) // a fresh token for cli's unary calls; the stream keeps its old one
		_ = later.Done()
		deleteAndAwaitLoss(t, s, cli, admin, []*core.Hold{later, first})
	})
}

func TestHoldsWatchedAcrossARestartAfterAnAuthChangeAreToldOfTheirDelete(t *testing.T) {
	onEachJWTSetup(t, func(t *testing.T, s setup, cli, admin *clientv3.Client) {
		holds := acquireHolds(t, cli, 5)
		for _, h := range holds {
			_ = h.Done()
		}
		changeAuth(t, admin) // cli learns of it only when etcd refuses its token
		s.c.Stop(0)          // the stream is opened again, with whatever token cli has then
		require.NoError(t, s.c.Restart(0))
		deleteAndAwaitLoss(t, s, cli, admin, holds)
	})
}
