//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

// testMaxHoldStopsTheCommand: with --max-hold the command is stopped once the hold has
// lasted that long, and etcdsync exits 123 with one line; every kind of hold.
func testMaxHoldStopsTheCommand(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev := newEvents(t)
	body := `trap 'echo "term $ID" >"$EV"; exit 0' TERM; echo "start $ID" >"$EV"; ` + waitLoop
	for _, kind := range kinds {
		name := "cmd-maxhold-" + kind
		started := time.Now()
		p := h.start(t, environ("EV="+ev.path, "ID="+kind), append(holdArgs(kind, name, "--max-hold", "1s", "--grace", "2s"), script(body)...)...)
		assert.Equal(t, "start "+kind, ev.next(t, 30*time.Second))
		assert.Equal(t, "term "+kind, ev.next(t, 30*time.Second))
		assert.GreaterOrEqual(t, time.Since(started), time.Second, "stopped before the maximum hold")
		assert.Equal(t, exitMaxHold, p.wait(30*time.Second), "%s: %s", kind, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync "+kind+": ")
		assert.Contains(t, p.stderr.text(), "held for --max-hold 1s: the command was stopped")
		nothingLeft(t, cli, "", name)
	}
	// Without a command, the hold is released at the maximum.
	p := h.start(t, environ(), "lock", "--max-hold", "1s", "cmd-maxhold-nocommand")
	p.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
	assert.Equal(t, exitMaxHold, p.wait(30*time.Second), p.stderr.text())
	assert.Equal(t, `etcdsync lock: lock "cmd-maxhold-nocommand" held for --max-hold 1s: released`+"\n", p.stderr.text())
	nothingLeft(t, cli, "", "cmd-maxhold-nocommand")
}

// testMaxHoldReleasesOnceTheGroupIsGone: at --max-hold the command's group is stopped
// first, and the hold released only once the group is gone, so the next holder's command
// never runs beside it: not while a command that traps SIGTERM takes its time to finish,
// nor while one that ignores SIGTERM waits for SIGKILL after --grace. Every kind of hold;
// the next holder of an rlock is a writer (Go's rwmutex), of the others the same command.
// The next holder's command checks, when it starts, that the first's process is gone.
func testMaxHoldReleasesOnceTheGroupIsGone(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev := newEvents(t)
	// A command that finishes its work in a SIGTERM trap, for a second of its 5 s grace.
	finishing := `trap 'echo term >"$EV"; sleep 1; echo exit >"$EV"; exit 0' TERM; echo "start $$" >"$EV"; ` + waitLoop
	// A command whose whole group ignores SIGTERM: SIGKILL after --grace.
	ignoring := `trap '' TERM; echo "start $$" >"$EV"; ` + waitLoop
	for _, tc := range []struct {
		kind, body, grace string
		events            []string // what the first command writes after it started
	}{
		{"lock", finishing, "5s", []string{"term", "exit"}},
		{"rlock", finishing, "5s", []string{"term", "exit"}},
		{"sem", finishing, "5s", []string{"term", "exit"}},
		{"elect", finishing, "5s", []string{"term", "exit"}},
		{"lock", ignoring, "1s", nil},
	} {
		name := fmt.Sprintf("cmd-maxhold-next-%s-%s", tc.kind, tc.grace)
		first := h.start(t, environ("EV="+ev.path), append(holdArgs(tc.kind, name, "--max-hold", "3s", "--grace", tc.grace), script(tc.body)...)...)
		started, ok := strings.CutPrefix(ev.next(t, 30*time.Second), "start ")
		require.True(t, ok)
		pid, err := strconv.Atoi(started)
		require.NoError(t, err)

		var next *process
		var writer *rwmutex.RWMutex
		var written <-chan error
		if tc.kind == "rlock" {
			writer, err = rwmutex.New(cli, name)
			require.NoError(t, err)
			written = etcdtest.Async(func() error {
				err := writer.Lock(etcdtest.Context(t))
				if err == nil && alive(pid) {
					err = fmt.Errorf("the writer holds while the reader's command %d still runs", pid)
				}
				return err
			})
		} else {
			body := `if kill -0 "$FIRST" 2>/dev/null; then echo "next beside"; else echo "next after"; fi >"$EV"`
			next = h.start(t, environ("EV="+ev.path, "FIRST="+started), append(holdArgs(tc.kind, name), script(body)...)...)
		}
		sub := map[string]string{"rlock": core.KindWrite, "sem": core.KindPermit}[tc.kind]
		etcdtest.AwaitKeys(t, cli, core.NamePrefix(name)+sub, int64(1+btoi(tc.kind != "rlock")))

		for _, want := range tc.events {
			assert.Equal(t, want, ev.next(t, 30*time.Second), "%s %s", tc.kind, tc.grace)
		}
		assert.Equal(t, exitMaxHold, first.wait(30*time.Second), "%s: %s", tc.kind, first.stderr.text())
		assert.False(t, alive(pid), "%s: the first command outlived its etcdsync", tc.kind)
		if tc.kind == "rlock" {
			require.NoError(t, etcdtest.Within(t, written, 30*time.Second, "the writer"))
			require.NoError(t, writer.Unlock(etcdtest.Context(t)))
		} else {
			assert.Equal(t, "next after", ev.next(t, 30*time.Second), "%s %s: the next command started beside the first", tc.kind, tc.grace)
			assert.Equal(t, 0, next.wait(30*time.Second), "%s: %s", tc.kind, next.stderr.text())
		}
		ev.none(t, tc.kind)
		nothingLeft(t, cli, "", name)
	}
}

// testLockDelayAfterAKilledHolder: a waiter with --lock-delay D starts its command no
// sooner than D after its holder was killed (SIGKILL: its lease runs out), and long before
// D (20 s) after a holder that released.
func testLockDelayAfterAKilledHolder(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	for _, how := range []string{"killed", "released"} {
		name := "cmd-lockdelay-" + how
		delay := 3 * time.Second
		if how == "released" {
			delay = 20 * time.Second
		}
		holder := h.start(t, environ(), "lock", "--ttl", "2s", name)
		holder.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
		waiter := h.start(t, environ(), append([]string{"lock", "--lock-delay", delay.String(), name}, script("echo served")...)...)
		etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
		ended := time.Now()
		if how == "killed" {
			require.NoError(t, holder.cmd.Process.Kill())
		} else {
			holder.signal(syscall.SIGTERM)
		}
		line := waiter.stdout.next(t, 40*time.Second)
		served := time.Since(ended)
		assert.Equal(t, "served", strings.TrimSpace(line))
		if how == "killed" {
			assert.GreaterOrEqual(t, served, delay, "served within the lock-delay of a killed holder")
		} else {
			assert.Less(t, served, delay, "a release waited for the lock-delay")
		}
		assert.Equal(t, 0, waiter.wait(30*time.Second), waiter.stderr.text())
		holder.wait(30 * time.Second)
		nothingLeft(t, cli, "", name)
	}
}

// testDetachRenewRelease: lock --detach prints a ticket and exits 0 with the name still
// held (another lock --try is busy); renew renews it and prints the seconds left; release
// --ticket releases it (the name is free, nothing left); the ticket is then stale: renew
// and release --ticket exit 1. A malformed ticket is exit 64, --detach with a command too.
func testDetachRenewRelease(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	const name = "cmd-detach"
	p := h.run(t, environ(), "lock", "--detach", "--ttl", "30s", name)
	require.Equal(t, 0, p.code, p.stderr.text())
	ticket := strings.TrimSpace(p.stdout.text())
	require.True(t, strings.HasPrefix(ticket, "t1."), "the ticket: %q", ticket)
	keys := keysOf(t, cli, "", name)
	require.Len(t, keys, 1, "the detached hold's key")
	assert.Equal(t, exitBusy, h.run(t, environ(), "lock", "--try", name, "--", "true").code, "the name is still held")

	r := h.run(t, environ(), "renew", ticket)
	require.Equal(t, 0, r.code, r.stderr.text())
	secs, err := strconv.Atoi(strings.TrimSpace(r.stdout.text()))
	require.NoError(t, err)
	assert.InDelta(t, 30, secs, 2, "the seconds left after a renewal")

	rel := h.run(t, environ(), "release", "--ticket", ticket)
	require.Equal(t, 0, rel.code, rel.stderr.text())
	nothingLeft(t, cli, "", name)
	stale := h.run(t, environ(), "renew", ticket)
	assert.Equal(t, exitFree, stale.code, "renew of a released hold")
	assert.Regexp(t, `^etcdsync renew: stale ticket: cmd-detach/\S+: its \S.*: nothing changed\n$`, stale.stderr.text())
	stale = h.run(t, environ(), "release", "--ticket", ticket)
	assert.Equal(t, exitFree, stale.code, "release of a released hold")
	assert.Regexp(t, `^etcdsync release: stale ticket: cmd-detach/\S+: its \S.*: nothing changed\n$`, stale.stderr.text())

	assert.Equal(t, exitUsage, h.run(t, environ(), "renew", "not-a-ticket").code)
	assert.Equal(t, exitUsage, h.run(t, environ(), "release", "--ticket", ticket, name).code)
	assert.Equal(t, exitUsage, h.run(t, environ(), "lock", "--detach", name, "--", "true").code)
	nothingLeft(t, cli, "", name)
}

// testAskStopsACommandThatYields: etcdsync ask with a token no key of the name has is exit
// 1 and writes nothing; with the hold's token, a command run with --yield-on-ask gets
// SIGTERM, etcdsync exits with its status once it is gone, and releases; without
// --yield-on-ask the same ask leaves the command running to its own end. Every kind of hold
// but elect, whose asks are transfers; without a command, --yield-on-ask releases, exit 0.
func testAskStopsACommandThatYields(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev := newEvents(t)
	stop := filepath.Join(t.TempDir(), "stop")
	body := `trap 'echo term >"$EV"; exit 7' TERM; echo "start $$" >"$EV"; ` +
		`while [ ! -e "$STOP" ]; do sleep 0.1; done; echo done >"$EV"`
	for _, tc := range []struct {
		kind  string
		yield bool
	}{{"lock", true}, {"rlock", true}, {"sem", true}, {"once", true}, {"lock", false}} {
		name := fmt.Sprintf("cmd-ask-%s-%t", tc.kind, tc.yield)
		var flags []string
		if tc.yield {
			flags = append(flags, "--yield-on-ask")
		}
		if tc.kind == "once" {
			flags = append(flags, "--every", "1h")
		}
		first := h.start(t, environ("EV="+ev.path, "STOP="+stop), append(holdArgs(tc.kind, name, flags...), script(body)...)...)
		_, ok := strings.CutPrefix(ev.next(t, 30*time.Second), "start ")
		require.True(t, ok)
		keys := keysOf(t, cli, "", name)
		require.NotEmpty(t, keys)
		token := keys[len(keys)-1].rev // a semaphore's limit record is older than its permit

		wrong := h.run(t, environ(), "ask", name, "--token", strconv.FormatInt(token+1, 10))
		assert.Equal(t, exitFree, wrong.code, "%s", wrong.stderr.text())
		assert.Contains(t, wrong.stderr.text(), "nothing changed")
		resp, err := cli.Get(etcdtest.Context(t), strings.TrimSuffix(core.NamePrefix(name), "/")+"\x00asked/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		assert.Zero(t, resp.Count, "a wrong token writes nothing")

		asked := h.run(t, environ(), "ask", name, "--token", strconv.FormatInt(token, 10), "--reason", "deploy")
		require.Equal(t, 0, asked.code, "%s", asked.stderr.text())
		if tc.yield {
			assert.Equal(t, "term", ev.next(t, 30*time.Second), tc.kind)
			assert.Equal(t, 7, first.wait(30*time.Second), "%s: %s", tc.kind, first.stderr.text())
			assert.Contains(t, first.stderr.text(), "asked to let go", tc.kind)
		} else {
			st := h.run(t, environ(), "status", name)
			require.Equal(t, 0, st.code, "%s", st.stderr.text())
			assert.Contains(t, st.stdout.text(), "holds(asked)")
			assert.Contains(t, st.stdout.text(), fmt.Sprintf("token %d asked to let go by ", token))
			assert.Contains(t, st.stdout.text(), `: "deploy"`)
			// The ask reaches the holder within milliseconds; the command polls every 100 ms:
			// had the ask stopped it, "term" would come before "done".
			require.NoError(t, os.WriteFile(stop, nil, 0o600))
			assert.Equal(t, "done", ev.next(t, 30*time.Second), "an ask without --yield-on-ask stops nothing")
			assert.Equal(t, 0, first.wait(30*time.Second), "%s", first.stderr.text())
			require.NoError(t, os.Remove(stop))
		}
		ev.none(t, tc.kind)
		nothingLeft(t, cli, "", name)
	}

	// Without a command: the hold is released at the ask, exit 0.
	name := "cmd-ask-nocmd"
	holder := h.start(t, environ(), "lock", "--yield-on-ask", name)
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 1)
	keys := keysOf(t, cli, "", name)
	require.Len(t, keys, 1)
	asked := h.run(t, environ(), "ask", name, "--token", strconv.FormatInt(keys[0].rev, 10))
	require.Equal(t, 0, asked.code, "%s", asked.stderr.text())
	assert.Equal(t, 0, holder.wait(30*time.Second), "%s", holder.stderr.text())
	nothingLeft(t, cli, "", name)
}
