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

// testTransfer: `etcdsync transfer --to` moves the leadership of an `elect --loop` to the
// candidate named: the leader's command is stopped, the candidate's starts with the same
// token, and the old leader campaigns again; without --to the leader steps down; refusals
// change nothing and say why.
func testTransfer(t *testing.T, h *harness) {
	const name = "cmd-transfer"
	cli := cluster.Client(t)
	ev := newEvents(t)
	body := `trap 'echo "stopped $ID" >"$EV"; exit 0' TERM; echo "lead $ID $ETCDSYNC_TOKEN" >"$EV"; sleep 300 & wait`
	start := func(id string, flags ...string) *process {
		env := environ("EV="+ev.path, "ID="+id)
		args := append(append([]string{"elect", "--loop", "--value", id}, flags...), name)
		return h.start(t, env, append(args, script(body)...)...)
	}
	lead := func() (string, int64) {
		t.Helper()
		f := strings.Fields(ev.next(t, 30*time.Second))
		require.Len(t, f, 3)
		require.Equal(t, "lead", f[0])
		tok, err := strconv.ParseInt(f[2], 10, 64)
		require.NoError(t, err)
		return f[1], tok
	}

	p := h.run(t, environ(), "transfer", name)
	assert.Equal(t, exitFree, p.code, "nobody leads: %s", p.stderr.text())
	a := start("a")
	who, token := lead()
	require.Equal(t, "a", who)
	b := start("b")
	c := start("c")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 3)

	before := etcdtest.Revision(t, cli)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"transfer", "--to", "nobody", name}, exitFree},
		{[]string{"transfer", "--to", "", name}, exitUsage},
		{[]string{"transfer"}, exitUsage},
		{[]string{"transfer", name, "other"}, exitUsage},
	} {
		p := h.run(t, environ(), tc.args...)
		assert.Equal(t, tc.code, p.code, "%v: %s", tc.args, p.stderr.text())
	}
	for _, w := range etcdtest.Writes(t, cli, before) { // other subtests write beside it
		assert.NotContains(t, w, " "+core.NamePrefix(name), "a refused transfer wrote")
	}

	p = h.run(t, environ(), "transfer", "--to", "c", name)
	require.Equal(t, 0, p.code, p.stderr.text())
	assert.Equal(t, "c token "+strconv.FormatInt(token, 10)+"\n", p.stdout.text())
	assert.Equal(t, "stopped a", ev.next(t, 30*time.Second), "the leader's command is stopped first")
	who, got := lead()
	assert.Equal(t, "c", who, "the candidate named leads, ahead of b")
	assert.Equal(t, token, got, "the token passes with the key")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 3) // a campaigns again (--loop)

	p = h.run(t, environ(), "transfer", name)
	require.Equal(t, 0, p.code, p.stderr.text())
	assert.Equal(t, "stopped c", ev.next(t, 30*time.Second))
	who, got = lead()
	assert.Equal(t, "b", who, "after a step-down the next in line leads")
	assert.Greater(t, got, token)
	for _, p := range []*process{a, b, c} {
		p.signal(syscall.SIGTERM)
	}
	for _, p := range []*process{a, b, c} {
		assert.Equal(t, 128+15, p.wait(30*time.Second), p.stderr.text())
	}
	nothingLeft(t, cli, "", name)
}

// testTransferToAGoneCandidate: `etcdsync transfer --to` a candidate whose process was
// killed (its key stays until its lease ends) exits 1 and changes nothing: the leader's
// command is never signalled, and it leads on until it is stopped.
func testTransferToAGoneCandidate(t *testing.T, h *harness) {
	const name = "cmd-transfer-gone"
	cli := cluster.Client(t)
	ev := newEvents(t)
	body := `trap 'echo "stopped $ID" >"$EV"; exit 0' TERM; echo "lead $ID" >"$EV"; sleep 300 & wait`
	start := func(id string) *process {
		return h.start(t, environ("EV="+ev.path, "ID="+id), append([]string{"elect", "--value", id, name}, script(body)...)...)
	}
	leader := start("a")
	require.Equal(t, "lead a", ev.next(t, 30*time.Second))
	gone := start("b")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
	gone.signal(syscall.SIGKILL)
	gone.wait(30 * time.Second)
	require.Len(t, keysOf(t, cli, "", name), 2, "the killed candidate's key stays until its lease ends")

	p := h.run(t, environ(), "transfer", "--to", "b", name)
	assert.Equal(t, exitFree, p.code, "stdout: %sstderr: %s", p.stdout.text(), p.stderr.text())
	assert.Contains(t, p.stderr.text(), `"a" leads on`)
	ev.none(t, "the leader's command was signalled")
	keys := keysOf(t, cli, "", name)
	require.NotEmpty(t, keys)
	assert.Equal(t, "a", keys[0].value, "the leader leads on")
	select {
	case <-leader.exited:
		t.Fatalf("the leader exited %d: %s", leader.code, leader.stderr.text())
	default:
	}
	leader.signal(syscall.SIGTERM)
	assert.Equal(t, "stopped a", ev.next(t, 30*time.Second), "the leader's command ran on")
	assert.Equal(t, 128+15, leader.wait(30*time.Second), leader.stderr.text())
	for _, k := range keysOf(t, cli, "", name) { // the killed candidate's, if it is still there
		_, err := cli.Delete(etcdtest.Context(t), k.key)
		require.NoError(t, err)
	}
}

// testTransferGivenUpLeadsOn: the candidate answers, so the leader stops its command, but
// the candidate is stopped (SIGTERM) before the command is gone: the handover fails,
// `transfer` exits 1, and the leader leads on with the same token, running its command
// again.
func testTransferGivenUpLeadsOn(t *testing.T, h *harness) {
	const name = "cmd-transfer-given-up"
	cli := cluster.Client(t)
	ev, g := newEvents(t), newGates(t)
	g.make(t, "a")
	body := `trap 'echo "stopping $ID" >"$EV"; read _ <"$GATES/go.$ID"; exit 0' TERM; echo "lead $ID $ETCDSYNC_TOKEN" >"$EV"; sleep 300 & wait`
	leader := h.start(t, environ("EV="+ev.path, "GATES="+g.dir, "ID=a"), append([]string{"elect", "--value", "a", name}, script(body)...)...)
	first := ev.next(t, 30*time.Second)
	require.True(t, strings.HasPrefix(first, "lead a "), first)
	candidate := h.start(t, environ(), append([]string{"elect", "--value", "b", name}, script("true")...)...)
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)

	transfer := h.start(t, environ(), "transfer", "--to", "b", name)
	require.Equal(t, "stopping a", ev.next(t, 30*time.Second), "the candidate answered: the leader stops its command")
	candidate.signal(syscall.SIGTERM)
	assert.Equal(t, 128+15, candidate.wait(30*time.Second), candidate.stderr.text())
	g.open(t, "a")
	assert.Equal(t, first, ev.next(t, 30*time.Second), "the leader leads on, with the same token, and runs its command again")
	assert.Equal(t, exitFree, transfer.wait(30*time.Second), "stdout: %sstderr: %s", transfer.stdout.text(), transfer.stderr.text())
	keys := keysOf(t, cli, "", name)
	require.Len(t, keys, 1)
	assert.Equal(t, "a", keys[0].value)

	leader.signal(syscall.SIGTERM)
	assert.Equal(t, "stopping a", ev.next(t, 30*time.Second))
	g.open(t, "a")
	assert.Equal(t, 128+15, leader.wait(30*time.Second), leader.stderr.text())
	nothingLeft(t, cli, "", name)
}

// testElectPrefer: a candidate of a higher --prefer takes the leadership over once it has
// waited --settle; the leader's command is stopped and the leader exits 0 (no --loop).
func testElectPrefer(t *testing.T, h *harness) {
	const name = "cmd-elect-prefer"
	cli := cluster.Client(t)
	ev := newEvents(t)
	body := `trap 'echo "stopped $ID" >"$EV"; exit 0' TERM; echo "lead $ID" >"$EV"; sleep 300 & wait`
	old := h.start(t, environ("EV="+ev.path, "ID=old"), append([]string{"elect", "--settle", "200ms", name}, script(body)...)...)
	assert.Equal(t, "lead old", ev.next(t, 30*time.Second))
	preferred := h.start(t, environ("EV="+ev.path, "ID=new"), append([]string{"elect", "--prefer", "1", "--settle", "200ms", name}, script(body)...)...)
	assert.Equal(t, "stopped old", ev.next(t, 30*time.Second))
	assert.Equal(t, "lead new", ev.next(t, 30*time.Second))
	assert.Equal(t, 0, old.wait(30*time.Second), old.stderr.text())
	preferred.signal(syscall.SIGTERM)
	assert.Equal(t, 128+15, preferred.wait(30*time.Second), preferred.stderr.text())
	nothingLeft(t, cli, "", name)
}
