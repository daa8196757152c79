package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

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
// (leases, tokens, TTLs, this host and pid, times of now). Run with -update to rewrite them.
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
	for i := range 3 { // a limit of 2: two hold, one waits
		q.enqueue(p, int64(i+2), func(ctx context.Context, cli *clientv3.Client) (func(context.Context) error, error) {
			s, err := semaphore.New(cli, semName, 2)
			if err != nil {
				return nil, err
			}
			permit, err := s.Acquire(ctx)
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
	lease, err := cli.Grant(testContext(t), 60)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
	p = core.NamePrefix(ownersName)
	for i, value := range []string{
		"host=web-3 pid=4711 since=2001-02-03T04:05:06Z owner=5b0e6c1e-7a43-4f55-9d42-3c0b8f0f3f1a",
		"host=web-4",
		"pid=12 since=2001-02-03T04:05:07Z",
		"a value that names no owner",
	} {
		_, err := cli.Put(testContext(t), fmt.Sprintf("%s%x_%d", p, int64(lease.ID), i), value, clientv3.WithLease(lease.ID))
		require.NoError(t, err)
	}

	names := []string{lockName, rwName, semName, ownersName, emptyName}
	norm := newNormalizer(t, cli, append(names, electName))
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"status.txt", append([]string{"status"}, names...)},
		{"status-election.txt", []string{"status", "--kind", "election", electName}},
		{"status.json", append([]string{"status", "--json"}, append(names, electName)...)},
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

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to write it")
	assert.Equal(t, string(want), got, "%s differs; run with -update to rewrite it", path)
}

// normalizer makes status output comparable from run to run: it names the leases L1, L2, ...
// and the tokens T1, T2, ... in the order etcd created them, shows TTLs as <ttl>, and this
// host, pid and the times of now as HOST, PID, SINCE.
type normalizer struct {
	leases      *strings.Replacer
	tokens      map[string]string
	host        string
	pid         string
	uuid, stamp *regexp.Regexp
}

func newNormalizer(t *testing.T, cli *clientv3.Client, names []string) *normalizer {
	var all []*keyInfo
	for _, n := range names {
		all = append(all, keysOf(t, cli, "", n)...)
	}
	slices.SortFunc(all, func(a, b *keyInfo) int { return int(a.rev - b.rev) })
	var leases []string
	tokens := map[string]string{}
	seen := map[clientv3.LeaseID]bool{}
	for i, k := range all {
		tokens[strconv.FormatInt(k.rev, 10)] = fmt.Sprintf("T%d", i+1)
		if k.lease != 0 && !seen[k.lease] {
			seen[k.lease] = true
			leases = append(leases, fmt.Sprintf("%x", int64(k.lease)), fmt.Sprintf("L%d", len(seen)))
		}
	}
	host, _ := os.Hostname()
	return &normalizer{
		leases: strings.NewReplacer(leases...),
		tokens: tokens,
		host:   host,
		pid:    strconv.Itoa(os.Getpid()),
		uuid:   regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`),
		stamp:  regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`),
	}
}

// token is the name of a token, or "T?" for one that no key of the names had.
func (n *normalizer) token(rev string) string {
	if name, ok := n.tokens[rev]; ok {
		return name
	}
	return "T?"
}

// owner normalizes an owner's text or a key's value.
func (n *normalizer) owner(s string) string {
	s = n.uuid.ReplaceAllString(s, "UUID")
	s = n.stamp.ReplaceAllStringFunc(s, func(stamp string) string {
		if at, err := time.Parse(time.RFC3339, stamp); err == nil && time.Since(at).Abs() < time.Hour {
			return "SINCE"
		}
		return stamp
	})
	for _, pid := range []string{"pid " + n.pid, "pid=" + n.pid} {
		s = strings.ReplaceAll(s, pid, pid[:4]+"PID")
	}
	if n.host != "" {
		s = regexp.MustCompile(`(^|[ =])`+regexp.QuoteMeta(n.host)+`( |$)`).ReplaceAllString(s, "${1}HOST$2")
	}
	return s
}

// text normalizes status's text: each table row field by field, whitespace as one space.
func (n *normalizer) text(out string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		f := strings.Fields(line)
		if strings.HasPrefix(line, "  ") && len(f) >= 8 && f[0] != "POS" { // a row of a queue
			f[3] = n.leases.Replace(f[3])
			f[4] = n.token(f[4])
			f[5] = n.leases.Replace(f[5])
			if strings.HasSuffix(f[6], "s") {
				f[6] = "<ttl>"
			}
			f = append(f[:7], n.owner(strings.Join(f[7:], " ")))
		}
		b.WriteString(strings.Join(f, " ") + "\n")
	}
	return b.String()
}

// json normalizes status's JSON, and indents it.
func (n *normalizer) json(out string) string {
	var snap map[string]any
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		return fmt.Sprintf("not JSON (%v):\n%s", err, out)
	}
	snap["revision"] = "REV"
	for _, ns := range snap["names"].([]any) {
		for _, e := range ns.(map[string]any)["queue"].([]any) {
			e := e.(map[string]any)
			e["key"] = n.leases.Replace(e["key"].(string))
			e["token"] = n.token(strconv.FormatFloat(e["token"].(float64), 'f', -1, 64))
			if l, ok := e["lease"].(string); ok {
				e["lease"] = n.leases.Replace(l)
			}
			if _, ok := e["ttl"]; ok {
				e["ttl"] = "<ttl>"
			}
			e["value"] = n.owner(e["value"].(string))
			if owner, ok := e["owner"].(map[string]any); ok {
				for k, v := range owner {
					owner[k] = n.owner(k + "=" + v.(string))[len(k)+1:]
				}
			}
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(snap); err != nil {
		return err.Error()
	}
	return b.String()
}

// testStatusWatchFollowsChanges: `status --watch --json` writes a line at every change of the
// queue, and ends with 0 on SIGINT.
func testStatusWatch(t *testing.T, h *harness) {
	const name = "cmd-status-watch"
	cli := cluster.Client(t)
	p := h.start(t, environ(), "status", "--watch", "--json", name)
	await := func(what string, ok func(queue []entry) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var snap snapshot
			line := p.stdout.next(t, time.Until(deadline))
			require.NoError(t, json.Unmarshal([]byte(line), &snap), line)
			require.Len(t, snap.Names, 1)
			if ok(snap.Names[0].Queue) {
				return
			}
		}
	}
	await("nobody", func(q []entry) bool { return len(q) == 0 })
	holder, err := mutex.New(cli, name)
	require.NoError(t, err)
	require.NoError(t, holder.Lock(testContext(t)))
	await("a holder", func(q []entry) bool { return len(q) == 1 && q[0].State == stateHolds })

	waiter, err := mutex.New(cluster.Client(t), name)
	require.NoError(t, err)
	waited := etcdtest.Async(func() error { return waiter.Lock(testContext(t)) })
	await("a holder and a waiter", func(q []entry) bool { return len(q) == 2 && q[1].State == stateWaits })
	require.NoError(t, holder.Unlock(testContext(t)))
	require.NoError(t, etcdtest.Within(t, waited, 30*time.Second, "the waiter"))
	await("the waiter holds", func(q []entry) bool { return len(q) == 1 && q[0].Key == waiter.Key() })
	require.NoError(t, waiter.Unlock(testContext(t)))
	await("nobody again", func(q []entry) bool { return len(q) == 0 })

	p.signal(syscall.SIGINT)
	assert.Equal(t, 0, p.wait(30*time.Second), p.stderr.text())
	nothingLeft(t, cli, "", name)
}
