//go:build unix

package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// ignoringTERM is a command whose whole group ignores SIGTERM (sleep inherits the ignored
// signal), after it has written its pid to $EV.
const ignoringTERM = `trap '' TERM; echo "start $$" >"$EV"; ` + waitLoop

// startIgnoringTERM starts `etcdsync lock --verbose` with ignoringTERM and flags on name, and
// a second etcdsync that waits on name; it returns both once the waiter is in line, and the
// pid of the first's command.
func startIgnoringTERM(t *testing.T, h *harness, ev *events, name string, flags ...string) (holder, waiter *process, pid int) {
	t.Helper()
	args := append(append([]string{"lock", "--verbose"}, flags...), name)
	holder = h.start(t, environ("EV="+ev.path), append(args, script(ignoringTERM)...)...)
	pid, err := strconv.Atoi(strings.TrimPrefix(ev.next(t, 30*time.Second), "start "))
	require.NoError(t, err)
	waiter = h.start(t, environ("EV="+ev.path), append([]string{"lock", name}, script(`echo waiter >"$EV"`)...)...)
	etcdtest.AwaitKeys(t, cluster.Client(t), core.NamePrefix(name), 2)
	return holder, waiter, pid
}

// testStopEscalatesAfterGrace: SIGTERM to etcdsync goes to its command's group and starts
// --grace; a group that ignores it gets SIGKILL when the grace runs out, etcdsync exits 143
// with one line, and releases the name at once: the waiter runs long before the --ttl.
func testStopEscalatesAfterGrace(t *testing.T, h *harness) {
	const name, grace = "cmd-stop-grace", time.Second
	ev := newEvents(t)
	holder, waiter, pid := startIgnoringTERM(t, h, ev, name, "--grace", grace.String(), "--ttl", "60s")
	sent := time.Now()
	holder.signal(syscall.SIGTERM)
	assert.Equal(t, exitSignal+int(syscall.SIGTERM), holder.wait(30*time.Second), holder.stderr.text())
	assert.GreaterOrEqual(t, time.Since(sent), grace, "SIGKILL before --grace ran out")
	assert.False(t, alive(pid), "the command outlived etcdsync")
	assert.Contains(t, holder.stderr.text(), "etcdsync lock: SIGTERM: the command's process group got SIGKILL: --grace 1s ran out")
	assert.Equal(t, "waiter", ev.next(t, 20*time.Second), "the name was not released when the command was killed")
	assert.Less(t, time.Since(sent), 30*time.Second, "released by the lease's expiry, not by etcdsync")
	assert.Equal(t, 0, waiter.wait(30*time.Second), waiter.stderr.text())
	nothingLeft(t, cluster.Client(t), "", name)
}

// testSecondSignalKills: a second signal sends SIGKILL to the command's group at once, long
// before --grace; etcdsync's status is that of the first signal.
func testSecondSignalKills(t *testing.T, h *harness) {
	const name = "cmd-stop-twice"
	ev := newEvents(t)
	holder, waiter, pid := startIgnoringTERM(t, h, ev, name, "--grace", "10m")
	holder.signal(syscall.SIGTERM)
	// The first is handled before the second is sent: two signals sent at once may arrive as one.
	holder.stderr.awaitLine(t, "sent SIGTERM to process group", 30*time.Second)
	require.True(t, alive(pid), "the command died of the first SIGTERM, which it ignores")
	holder.signal(syscall.SIGINT)
	assert.Equal(t, exitSignal+int(syscall.SIGTERM), holder.wait(30*time.Second), holder.stderr.text())
	assert.False(t, alive(pid), "the command outlived etcdsync")
	assert.Contains(t, holder.stderr.text(), "etcdsync lock: SIGTERM: the command's process group got SIGKILL: SIGINT after SIGTERM")
	assert.Equal(t, "waiter", ev.next(t, 20*time.Second))
	assert.Equal(t, 0, waiter.wait(30*time.Second), waiter.stderr.text())
	nothingLeft(t, cluster.Client(t), "", name)
}

// testCommandFailedMapsTheCommandsStatus: with --command-failed N every non-zero status of the
// command, those that look like etcdsync's own too, is N; 0 stays 0, and etcdsync's own
// statuses (busy, not found) stay theirs.
func testCommandFailed(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	for i, tc := range []struct {
		flags   []string
		command []string
		want    int
	}{
		{nil, script("exit 0"), 0},
		{nil, script("exit 1"), 3},
		{nil, script("exit 64"), 3},
		{nil, script("exit 69"), 3},
		{nil, script("exit 75"), 3},
		{nil, script("exit 124"), 3},
		{nil, script("exit 125"), 3},
		{nil, script("kill -TERM $$"), 3},
		{[]string{"--shell"}, []string{"--", "no-such-command-etcdsync"}, 3}, // sh's 127
		{nil, []string{"--", "no-such-command-etcdsync"}, exitNotFound},
	} {
		name := fmt.Sprintf("cmd-command-failed-%d", i)
		p := h.run(t, environ(), append(append([]string{"lock", "--command-failed", "3"}, tc.flags...), append([]string{name}, tc.command...)...)...)
		assert.Equal(t, tc.want, p.code, "%q: %s", tc.command, p.stderr.text())
		nothingLeft(t, cli, "", name)
	}
	const name = "cmd-command-failed-busy"
	holder := h.start(t, environ(), "lock", name)
	holder.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
	p := h.run(t, environ(), append([]string{"lock", "--try", "--command-failed", "3", name}, script("exit 0")...)...)
	assert.Equal(t, exitBusy, p.code, p.stderr.text())
	holder.signal(syscall.SIGTERM)
	assert.Equal(t, 0, holder.wait(30*time.Second), holder.stderr.text())
	nothingLeft(t, cli, "", name)
}

// testRemovedWaiterWaitsAgain: a waiter whose key is deleted, or whose lease is revoked, by
// an operator is not exit 69: it takes a new place in line and runs its command in turn.
func testRemovedWaiterWaitsAgain(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	for _, how := range []string{"deleted", "revoked"} {
		name := "cmd-waiter-" + how
		holder := h.start(t, environ(), "lock", name)
		holder.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
		waiter := h.start(t, environ(), "lock", "--verbose", name, "--", "true")
		etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
		keys := keysOf(t, cli, "", name)
		require.Len(t, keys, 2)
		if how == "deleted" {
			_, err := cli.Delete(etcdtest.Context(t), keys[1].key)
			require.NoError(t, err)
		} else {
			_, err := cli.Revoke(etcdtest.Context(t), keys[1].lease)
			require.NoError(t, err)
		}
		waiter.stderr.awaitLine(t, "place in line lost", 30*time.Second)
		etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2) // in line again
		holder.signal(syscall.SIGTERM)
		assert.Equal(t, 0, holder.wait(30*time.Second), holder.stderr.text())
		assert.Equal(t, 0, waiter.wait(30*time.Second), "%s: %s", how, waiter.stderr.text())
		nothingLeft(t, cli, "", name)
	}
}
