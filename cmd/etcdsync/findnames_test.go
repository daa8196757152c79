//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// testStatusFindsEveryNameAtTheRoot: `etcdsync status` without NAME and --prefix lists the
// names at the root of the keyspace, where every name goes by default: those of etcd's own
// concurrency.Mutex and Election (etcdctl lock and elect use them), of etcdsync's
// primitives, and a semaphore nobody holds; not application data beside them, leased or not.
// Other subtests hold names at the root meanwhile: only this one's are checked, and the
// reads, one TimeToLive per lease of them all, get a minute.
func testStatusFindsEveryName(t *testing.T, h *harness) {
	q := newQueueing(t)
	cli := cluster.Client(t)
	const etcdMutex, etcdElection, ours, idleSem = "root-etcd-mutex", "root-etcd-election", "root/ours", "root-idle-sem"
	q.enqueue(etcdMutex+"/", 1, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			return nil, err
		}
		m := concurrency.NewMutex(s, etcdMutex)
		if err := m.Lock(ctx); err != nil {
			s.Close()
			return nil, err
		}
		return func(ctx context.Context) error { m.Unlock(ctx); return s.Close() }, nil
	})
	q.enqueue(etcdElection+"/", 1, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			return nil, err
		}
		e := concurrency.NewElection(s, etcdElection)
		if err := e.Campaign(ctx, "leader-1"); err != nil {
			s.Close()
			return nil, err
		}
		return func(ctx context.Context) error { e.Resign(ctx); return s.Close() }, nil
	})
	q.enqueue(core.NamePrefix(ours), 1, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		m, err := mutex.New(cli, ours)
		if err != nil {
			return nil, err
		}
		return m.Unlock, m.Lock(ctx)
	})
	s, err := semaphore.New(cli, idleSem, 2)
	require.NoError(t, err)
	permit, err := s.Acquire(etcdtest.Context(t))
	require.NoError(t, err)
	require.NoError(t, permit.Release(etcdtest.Context(t))) // the limit record stays
	lease, err := cli.Grant(etcdtest.Context(t), 60)
	require.NoError(t, err)
	data := map[string]clientv3.LeaseID{
		"root-data/42":           0,        // a lock's shape, no lease
		"root-data-leased/conf":  lease.ID, // a lease, not a lock's shape
		"root-data-nested/a/1f":  lease.ID, // a name under another prefix: shown with --prefix
		"root-data-limit/limit":  0,        // not a number
		"root-data-slot/1f_next": lease.ID,
	}
	for key, id := range data {
		_, err := cli.Put(etcdtest.Context(t), key, "x", clientv3.WithLease(id))
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		cli.Revoke(ctx, lease.ID)
		for key := range data {
			cli.Delete(ctx, key)
		}
		cli.Delete(ctx, core.NamePrefix(idleSem)+core.RecordLimit)
	})

	p := h.run(t, environ(), "status", "--json", "--command-timeout", "60s")
	require.Equal(t, 0, p.code, p.stderr.text())
	var snap admin.Snapshot
	require.NoError(t, json.Unmarshal([]byte(p.stdout.text()), &snap))
	found := map[string]admin.NameStatus{}
	for _, ns := range snap.Names {
		found[ns.Name] = ns
	}
	for name, want := range map[string]string{etcdMutex: "lock", etcdElection: "election", ours: "lock", idleSem: "semaphore"} {
		if assert.Contains(t, found, name, "status without NAME") {
			assert.Equal(t, want, found[name].Primitive, name)
		}
	}
	if assert.Contains(t, found, etcdMutex) && assert.Len(t, found[etcdMutex].Queue, 1) {
		assert.Equal(t, admin.StateHolds, found[etcdMutex].Queue[0].State)
	}
	for _, name := range []string{"root-data", "root-data-leased", "root-data-nested", "root-data-limit", "root-data-slot"} {
		assert.NotContains(t, found, name, "application data shown as a name")
	}

	p = h.run(t, environ(), "status", "--kind", "election", "--command-timeout", "60s")
	require.Equal(t, 0, p.code, p.stderr.text())
	out := p.stdout.text()
	assert.Contains(t, out, etcdElection+`: election, leader "leader-1", 1 leading, 0 waiting`+"\n")
	assert.Contains(t, out, etcdMutex+`: election, leader "", 1 leading, 0 waiting`+"\n", "--kind election: every lock too")
	assert.Contains(t, out, idleSem+": semaphore of 2, nobody holds or waits\n")
	assert.NotContains(t, out, "root-data")

	p = h.run(t, environ(), "status", "--prefix", "root-data-nested/")
	require.Equal(t, 0, p.code, p.stderr.text())
	// Its key's value, "x", is no lock's (a lock writes nothing, or its owner): an election's.
	assert.True(t, strings.HasPrefix(p.stdout.text(), `a: election, leader "x", 1 leading, 0 waiting`+"\n"), p.stdout.text())
}

// TestStatusFitsAnyMaxTxnOps: status reads names in pieces that the server takes, on a
// server started with a --max-txn-ops lower than its names (1: single Ranges), named and
// found alike.
func TestStatusFitsAnyMaxTxnOps(t *testing.T) {
	h := newHarness(t)
	for _, maxTxnOps := range []uint{3, 1} {
		t.Run(fmt.Sprint(maxTxnOps), func(t *testing.T) {
			endpoint := etcdtest.NewConfigured(t, func(cfg *embed.Config) { cfg.MaxTxnOps = maxTxnOps })
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			require.NoError(t, err)
			t.Cleanup(func() { cli.Close() })
			lease, err := cli.Grant(etcdtest.Context(t), 60)
			require.NoError(t, err)
			var names []string
			for i := range 12 {
				name := fmt.Sprintf("ops-%02d", i)
				names = append(names, name)
				_, err := cli.Put(etcdtest.Context(t), fmt.Sprintf("%s%x", core.NamePrefix(name), int64(lease.ID)), "", clientv3.WithLease(lease.ID))
				require.NoError(t, err)
			}
			env := environ("ETCDCTL_ENDPOINTS=" + endpoint)
			for _, args := range [][]string{append([]string{"status"}, names...), {"status"}} {
				p := h.run(t, env, append(args, "--namespace=", "--json")...)
				require.Equal(t, 0, p.code, "%q: %s", args, p.stderr.text())
				var snap admin.Snapshot
				require.NoError(t, json.Unmarshal([]byte(p.stdout.text()), &snap))
				var got []string
				for _, ns := range snap.Names {
					got = append(got, ns.Name)
					if assert.Len(t, ns.Queue, 1, ns.Name) {
						assert.Equal(t, admin.StateHolds, ns.Queue[0].State, ns.Name)
					}
				}
				assert.Equal(t, names, got, "%q", args)
			}
		})
	}
}
