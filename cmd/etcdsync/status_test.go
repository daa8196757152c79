//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// queueing holds and waits on names, in a known order, with the primitives themselves and
// with etcd's own concurrency package, each acquisition on a client (and so a lease) of its
// own; it takes back every hold and wait at cleanup.
type queueing struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	releases []func(context.Context) error
	clients  []*clientv3.Client
}

func newQueueing(t *testing.T) *queueing {
	ctx, cancel := context.WithCancel(context.Background())
	q := &queueing{t: t, ctx: ctx, cancel: cancel}
	t.Cleanup(func() {
		q.cancel() // the waits give up, deleting their keys
		q.wg.Wait()
		for _, release := range slices.Backward(q.releases) {
			assert.NoError(t, release(context.Background()))
		}
		for _, cli := range q.clients {
			cli.Close()
		}
	})
	return q
}

// enqueue starts acquire on a fresh client and returns once the name has n keys: held, or
// waiting in line. release, if acquire got the hold, gives it back at cleanup.
func (q *queueing) enqueue(prefix string, n int64, acquire func(ctx context.Context, cli *clientv3.Client) (release func(context.Context) error, err error)) {
	cli, err := cluster.NewClient()
	require.NoError(q.t, err)
	q.clients = append(q.clients, cli)
	q.wg.Go(func() {
		release, err := acquire(q.ctx, cli)
		if err != nil {
			if q.ctx.Err() == nil {
				q.t.Errorf("acquire under %s: %v", prefix, err)
			}
			return
		}
		q.mu.Lock()
		q.releases = append(q.releases, release)
		q.mu.Unlock()
	})
	etcdtest.AwaitKeys(q.t, cli, prefix, n)
}

// testStatusGolden queues holders and waiters on a name of every kind, and compares the
// text and JSON of `etcdsync status` with testdata/status*, volatile fields normalized
// (leases, tokens, TTLs, this host and pid, times of now). The election is told from the
// locks by its candidates' values, or by --kind. Run with -update to rewrite them.
func testStatusGolden(t *testing.T, h *harness) {
	q := newQueueing(t)
	const lockName, rwName, semName, electName = "status-lock", "status-rw", "status-sem", "status-elect"
	const ownersName, emptyName = "status/owners%", "status-empty"

	p := core.NamePrefix(lockName)
	q.enqueue(p, 1, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		m, err := mutex.New(cli, lockName)
		if err != nil {
			return nil, err
		}
		return m.Unlock, m.Lock(ctx)
	})
	q.enqueue(p, 2, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		m, err := reentrant.New(cli, lockName)
		if err != nil {
			return nil, err
		}
		owning, err := m.Lock(ctx)
		return func(context.Context) error { return m.Unlock(owning) }, err
	})
	q.enqueue(p, 3, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			return nil, err
		}
		m := concurrency.NewMutex(s, lockName) // etcd's own: keys "<name>/<lease hex>"
		if err := m.Lock(ctx); err != nil {
			s.Close()
			return nil, err
		}
		return func(ctx context.Context) error { m.Unlock(ctx); return s.Close() }, nil
	})

	p = core.NamePrefix(rwName)
	for i, write := range []bool{false, false, true, false} { // two readers hold, a writer and a reader wait
		q.enqueue(p, int64(i+1), func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
			rw, err := rwmutex.New(cli, rwName)
			if err != nil {
				return nil, err
			}
			if write {
				return rw.Unlock, rw.Lock(ctx)
			}
			return rw.RUnlock, rw.RLock(ctx)
		})
	}

	p = core.NamePrefix(semName)
	// The limit's record and marker of an earlier run (-count) would be older than every key
	// here and shift the tokens' numbering.
	_, err := cluster.Client(t).Delete(etcdtest.Context(t), p+core.RecordLimit, clientv3.WithPrefix())
	require.NoError(t, err)
	// A limit of 4: permits of 2 and 1 hold; one of 2 waits, and one of 1 behind it though
	// it would fit.
	for i, units := range []int{2, 1, 2, 1} {
		q.enqueue(p, int64(i+3), func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
			s, err := semaphore.New(cli, semName, 4)
			if err != nil {
				return nil, err
			}
			permit, err := s.AcquireN(ctx, units)
			return permit.Release, err
		})
	}

	p = core.NamePrefix(electName)
	for i, value := range []string{"alpha", "beta"} {
		q.enqueue(p, int64(i+1), func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
			e, err := election.New(cli, electName)
			if err != nil {
				return nil, err
			}
			return e.Resign, e.Campaign(ctx, value)
		})
	}
	q.enqueue(p, 3, func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			return nil, err
		}
		e := concurrency.NewElection(s, electName) // etcd's own
		if err := e.Campaign(ctx, "gamma"); err != nil {
			s.Close()
			return nil, err
		}
		return func(ctx context.Context) error { e.Resign(ctx); return s.Close() }, nil
	})

	// Keys of the layout with owners in their values, as etcdsync writes them, and without.
	cli := cluster.Client(t)
	lease, err := cli.Grant(etcdtest.Context(t), 60)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
	p = core.NamePrefix(ownersName)
	for i, value := range []string{
		"host=web-3 pid=4711 since=2001-02-03T04:05:06Z owner=5b0e6c1e-7a43-4f55-9d42-3c0b8f0f3f1a",
		"host=web-4",
		"pid=12 since=2001-02-03T04:05:07Z",
		"", // etcd's concurrency.Mutex, etcdctl lock: no owner
	} {
		_, err := cli.Put(etcdtest.Context(t), fmt.Sprintf("%s%x_%d", p, int64(lease.ID), i), value, clientv3.WithLease(lease.ID))
		require.NoError(t, err)
	}

	// Names found under a prefix: "a" and "b/c", not the stray key that belongs to no name.
	const under = "status-prefix/"
	for _, key := range []string{under + "a/" + core.KindRead + "1", under + "b%2Fc/1", under + "b%2Fc/2", under + "stray"} {
		_, err := cli.Put(etcdtest.Context(t), key, "", clientv3.WithLease(lease.ID))
		require.NoError(t, err)
	}

	names := []string{lockName, rwName, semName, ownersName, emptyName}
	norm := newNormalizer(t, cli, append(names, electName))
	norm.add(t, cli, under)
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"status.txt", append([]string{"status"}, append(names, electName)...)},
		{"status-election.txt", []string{"status", "--kind", "election", electName}},
		{"status-kind-lock.txt", []string{"status", "--kind", "lock", electName}},
		{"status.json", append([]string{"status", "--json"}, append(names, electName)...)},
		{"status-prefix.txt", []string{"status", "--prefix", under}},
	} {
		run := h.run(t, environ(), tc.args...)
		require.Equal(t, 0, run.code, run.stderr.text())
		got := norm.text(run.stdout.text())
		if strings.HasSuffix(tc.golden, ".json") {
			got = norm.json(run.stdout.text())
		}
		golden(t, tc.golden, got)
	}
}

// testStatusWatchFollowsChanges: `status --watch --json` writes a line at every change of the
// queue, and ends with 0 on SIGINT.
func testStatusWatch(t *testing.T, h *harness) {
	const name = "cmd-status-watch"
	cli := cluster.Client(t)
	p := h.start(t, environ(), "status", "--watch", "--json", name)
	await := func(what string, ok func(queue []admin.Entry) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var snap admin.Snapshot
			line := p.stdout.next(t, time.Until(deadline))
			require.NoError(t, json.Unmarshal([]byte(line), &snap), line)
			require.Len(t, snap.Names, 1)
			if ok(snap.Names[0].Queue) {
				return
			}
		}
	}
	await("nobody", func(q []admin.Entry) bool { return len(q) == 0 })
	holder, err := mutex.New(cli, name)
	require.NoError(t, err)
	require.NoError(t, holder.Lock(etcdtest.Context(t)))
	await("a holder", func(q []admin.Entry) bool { return len(q) == 1 && q[0].State == admin.StateHolds })

	waiter, err := mutex.New(cluster.Client(t), name)
	require.NoError(t, err)
	waited := etcdtest.Async(func() error { return waiter.Lock(etcdtest.Context(t)) })
	await("a holder and a waiter", func(q []admin.Entry) bool { return len(q) == 2 && q[1].State == admin.StateWaits })
	require.NoError(t, holder.Unlock(etcdtest.Context(t)))
	require.NoError(t, etcdtest.Within(t, waited, 30*time.Second, "the waiter"))
	await("the waiter holds", func(q []admin.Entry) bool { return len(q) == 1 && q[0].Key == waiter.Key() })
	require.NoError(t, waiter.Unlock(etcdtest.Context(t)))
	await("nobody again", func(q []admin.Entry) bool { return len(q) == 0 })

	p.signal(syscall.SIGINT)
	assert.Equal(t, 0, p.wait(30*time.Second), p.stderr.text())
	nothingLeft(t, cli, "", name)
}

// testStatusCheck: status --check prints nothing and exits 0 while every NAME is held, 1
// while one is free (a waiter alone does not hold), 69 if etcd cannot be reached; with
// --json it prints the document too.
func testStatusCheck(t *testing.T, h *harness) {
	const name, other = "cmd-status-check", "cmd-status-check-other"
	ctx := etcdtest.Context(t)
	check := func(want int, args ...string) *process {
		t.Helper()
		p := h.run(t, environ(), append([]string{"status", "--check"}, args...)...)
		assert.Equal(t, want, p.code, "%q: %s", args, p.stderr.text())
		return p
	}
	p := check(exitFree, name)
	assert.Empty(t, p.stdout.text())
	assert.Empty(t, p.stderr.text())

	holder, err := mutex.New(cluster.Client(t), name)
	require.NoError(t, err)
	require.NoError(t, holder.Lock(ctx))
	p = check(exitOK, name)
	assert.Empty(t, p.stdout.text())
	check(exitFree, name, other)
	p = check(exitOK, "--json", name)
	var snap admin.Snapshot
	require.NoError(t, json.Unmarshal([]byte(p.stdout.text()), &snap), p.stdout.text())
	require.Len(t, snap.Names, 1)
	assert.Equal(t, admin.StateHolds, snap.Names[0].Queue[0].State)

	require.NoError(t, holder.Unlock(ctx))
	check(exitFree, name)
	p = h.run(t, environ(), "status", "--check", "--endpoints", "127.0.0.1:1", "--command-timeout", "300ms", name)
	assert.Equal(t, exitEtcd, p.code, p.stderr.text())
	nothingLeft(t, cluster.Client(t), "", name)
}

// testRelease: release --token T ends the hold whose token is T (its holder, an etcdsync
// lock, exits 125) and says nothing; a wrong token changes nothing and exits 1; without
// --token it shows who holds on stderr and exits 64.
func testRelease(t *testing.T, h *harness) {
	const name = "cmd-release"
	cli := cluster.Client(t)
	holder := h.start(t, environ(), "lock", name, "--", "sleep", "600")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 1)
	resp, err := cli.Get(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	token := resp.Kvs[0].CreateRevision

	p := h.run(t, environ(), "release", name)
	assert.Equal(t, exitUsage, p.code, p.stderr.text())
	assert.Contains(t, p.stderr.text(), "--token missing")
	assert.Contains(t, p.stderr.text(), strconv.FormatInt(token, 10), "the holder's token shown")

	p = h.run(t, environ(), "release", name, "--token", strconv.FormatInt(token+1000, 10))
	assert.Equal(t, exitFree, p.code, p.stderr.text())
	assert.Contains(t, p.stderr.text(), "nothing changed")
	assert.Equal(t, int64(1), etcdtest.CountKeys(t, cli, core.NamePrefix(name)))

	waiter := h.start(t, environ(), "lock", name, "--", "true")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
	resp, err = cli.Get(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 2)
	p = h.run(t, environ(), "release", "--token", strconv.FormatInt(resp.Kvs[1].CreateRevision, 10), name)
	assert.Equal(t, exitOK, p.code, p.stderr.text())
	assert.Equal(t, exitLost, waiter.wait(30*time.Second), "a waiter released: %s", waiter.stderr.text())
	assertOneLine(t, waiter.stderr.text(), `etcdsync lock: the wait for lock "cmd-release" was ended: released by an operator, `)
	assert.Regexp(t, ` at \d{4}-\d\d-\d\dT[^ ]+, no reason given\n$`, waiter.stderr.text(), "a release without --reason")

	p = h.run(t, environ(), "release", "--token", strconv.FormatInt(token, 10), "--reason", "stuck", name)
	assert.Equal(t, exitOK, p.code, p.stderr.text())
	assert.Empty(t, p.stdout.text())
	assert.Equal(t, exitLost, holder.wait(30*time.Second), holder.stderr.text())
	assertOneLine(t, holder.stderr.text(), `etcdsync lock: lock "cmd-release" lost while the command ran (released by an operator, `)
	assert.Regexp(t, `, reason: "stuck"\): the command was stopped\n$`, holder.stderr.text())
	assert.NotContains(t, holder.stderr.text(), "lost: ", "the loss said twice")
	nothingLeft(t, cli, "", name)
}
