//go:build unix

package main

import (
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
