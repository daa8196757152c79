//go:build unix

package main

import (
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testLockOfSeveralNames: `etcdsync lock B A --` holds both names at once, one key under
// each with one token, which status shows under each name; a try on either is busy; the
// command after "--" sees the names and keys one per line; nothing is left after a signal.
// Without "--", what follows the first name is the command, as etcdctl lock runs it.
func testLockOfSeveralNames(t *testing.T, h *harness) {
	const a, b = "cmd-multi-a", "cmd-multi-b"
	cli := cluster.Client(t)
	p := h.start(t, environ(), "lock", b, a, a, "--")
	token := strings.TrimPrefix(p.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second), "ETCDSYNC_TOKEN=")
	assert.Equal(t, "ETCDSYNC_NAME='"+a+"\n"+b+"'\n", p.stdout.text()[:len("ETCDSYNC_NAME='"+a+"\n"+b+"'\n")])
	for _, name := range []string{a, b} {
		keys := keysOf(t, cli, "", name)
		require.Len(t, keys, 1, name)
		assert.Equal(t, token, strconv.FormatInt(keys[0].rev, 10), "the token of %s's key", name)
	}
	status := h.run(t, environ(), "status", a, b)
	require.Equal(t, 0, status.code, status.stderr.text())
	holds := regexp.MustCompile(`(?m)^  1 +lock +holds +\S+ +`+token+` `).FindAllString(status.stdout.text(), -1)
	assert.Len(t, holds, 2, "status shows the one token under each name:\n%s", status.stdout.text())

	busy := h.run(t, environ(), "lock", "--try", b, "--", "true")
	assert.Equal(t, exitBusy, busy.code, busy.stderr.text())
	p.signal(syscall.SIGTERM)
	assert.Equal(t, 0, p.wait(30*time.Second), p.stderr.text())
	nothingLeft(t, cli, "", a)
	nothingLeft(t, cli, "", b)

	child := h.run(t, environ(), "lock", a, b, "--", "/bin/sh", "-c",
		`test "$ETCDSYNC_NAME" = "$(printf '%s\n%s' "$1" "$2")" && test "$(echo "$ETCDSYNC_KEY" | wc -l)" -eq 2`, "sh", a, b)
	assert.Equal(t, 0, child.code, child.stderr.text())
	nothingLeft(t, cli, "", a)
	nothingLeft(t, cli, "", b)

	etcdctlForm := h.run(t, environ(), "lock", a, "/bin/sh", "-c", `test "$ETCDSYNC_NAME" = "$1" && exit 7`, "sh", a)
	assert.Equal(t, 7, etcdctlForm.code, "lock NAME CMD ARGS runs CMD: %s", etcdctlForm.stderr.text())
	nothingLeft(t, cli, "", a)
	assert.Empty(t, keysOf(t, cli, "", "/bin/sh"), "CMD taken as a name")
}
