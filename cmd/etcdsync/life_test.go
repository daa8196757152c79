//go:build unix

package main

import (
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
	assert.Equal(t, exitFree, h.run(t, environ(), "renew", ticket).code, "renew of a released hold")
	assert.Equal(t, exitFree, h.run(t, environ(), "release", "--ticket", ticket).code, "release of a released hold")

	assert.Equal(t, exitUsage, h.run(t, environ(), "renew", "not-a-ticket").code)
	assert.Equal(t, exitUsage, h.run(t, environ(), "release", "--ticket", ticket, name).code)
	assert.Equal(t, exitUsage, h.run(t, environ(), "lock", "--detach", name, "--", "true").code)
	nothingLeft(t, cli, "", name)
}
