//go:build unix

package main

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestBarrierAndLatchCommands builds the etcdsync binary once and runs `etcdsync barrier` and
// `etcdsync latch`, as real processes, against the test cluster: one subtest per behaviour,
// in parallel, each on names of its own.
func TestBarrierAndLatchCommands(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name string
		test func(*testing.T, *harness)
	}{
		{"BarrierRunsTheCommandsOnceNHaveEntered", testBarrierTogether},
		{"BarrierWithoutACommandWaitsUntilEveryoneLeft", testBarrierWithoutACommand},
		{"BarrierTimeoutSignalAndAnotherNLeaveNoKey", testBarrierTimeout},
		{"BarrierLossStopsTheCommand", testBarrierLoss},
		{"LatchCountsDownAndReleasesTheWaiters", testLatchCountsDown},
		{"LatchSetOnceAndNotSetAreExit1", testLatchSetAndNotSet},
		{"LatchWaitTimeoutAndDeletion", testLatchWaitTimeoutAndDeletion},
		{"BarrierAndLatchBadInputIsExit64", testBarrierLatchBadInput},
		{"BarrierAndLatchUnreachableEtcdIsExit69", testBarrierLatchUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, h)
		})
	}
}

// participantsPrefix is where the participants' keys of the barrier name are.
func participantsPrefix(name string) string { return core.NamePrefix(name) + "in/" }

// noBarrierLeft fails the test if a participant's key of name is left in etcd, and deletes
// the barrier's records (its round and size, which are meant to stay) and any latch of name.
func noBarrierLeft(t *testing.T, cli *clientv3.Client, name string) {
	t.Helper()
	assert.Zero(t, etcdtest.CountKeys(t, cli, participantsPrefix(name)), "a participant's key of %s left in etcd", name)
	_, err := cli.Delete(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
}

// exited reports whether p has exited by now.
func exited(p *process) bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// testBarrierTogether: of two `barrier -n 2 NAME -- CMD`, the first waits (its key written,
// its command not run) until the second has entered; then both run, see the name and the
// round (1, then 2 for the next pair) but no key or token of their own (one passed on from
// its environment stays), and exit 0 once both have left, leaving no participant's key.
func testBarrierTogether(t *testing.T, h *harness) {
	const name = "cmd-barrier-together"
	cli := cluster.Client(t)
	ev := newEvents(t)
	body := `echo "run $ID $ETCDSYNC_NAME $ETCDSYNC_ROUND ${ETCDSYNC_KEY-none} ${ETCDSYNC_TOKEN-none}" >"$EV"`
	for _, round := range []string{"1", "2"} {
		a := h.start(t, environ("EV="+ev.path, "ID=a"), append([]string{"barrier", "-n", "2", name}, script(body)...)...)
		etcdtest.AwaitKeys(t, cli, participantsPrefix(name), 1)
		ev.none(t, "one participant of two entered")
		st := h.run(t, environ(), "status", name)
		assert.Equal(t, 0, st.code, st.stderr.text())
		assert.Contains(t, st.stdout.text(), name+": barrier of 2, round "+round+", 0 entered, 1 waiting\n", "status")
		assert.Contains(t, st.stdout.text(), "participant  waits", "status")
		require.False(t, exited(a), "the first participant exited alone: %s", a.stderr.text())
		b := h.start(t, environ("EV="+ev.path, "ID=b", "ETCDSYNC_TOKEN=outer"), append([]string{"barrier", name, "-n", "2"}, script(body)...)...)
		got := []string{ev.next(t, 30*time.Second), ev.next(t, 30*time.Second)}
		slices.Sort(got)
		assert.Equal(t, []string{
			"run a " + name + " " + round + " none none",
			"run b " + name + " " + round + " none outer",
		}, got)
		assert.Equal(t, 0, a.wait(30*time.Second), a.stderr.text())
		assert.Equal(t, 0, b.wait(30*time.Second), b.stderr.text())
		assert.Empty(t, a.stderr.text()+b.stderr.text())
		assert.Zero(t, etcdtest.CountKeys(t, cli, participantsPrefix(name)))
	}
	// The command's status is etcdsync's, once every participant has left.
	c := h.start(t, environ(), append([]string{"barrier", "-n", "2", name}, script("exit 3")...)...)
	etcdtest.AwaitKeys(t, cli, participantsPrefix(name), 1)
	d := h.run(t, environ(), append([]string{"barrier", "-n", "2", "--command-failed", "7", name}, script("exit 4")...)...)
	assert.Equal(t, 7, d.code, d.stderr.text())
	assert.Equal(t, 3, c.wait(30*time.Second), c.stderr.text())
	noBarrierLeft(t, cli, name)
}

// testBarrierWithoutACommand: a participant without a command enters and leaves at once, but
// exits only once every participant of its round has left: here, once the other's command
// has ended. Two without a command meet and exit 0, printing nothing.
func testBarrierWithoutACommand(t *testing.T, h *harness) {
	const name = "cmd-barrier-bare"
	cli := cluster.Client(t)
	ev, g := newEvents(t), newGates(t)
	g.make(t, "a")
	body := `echo "run $ID" >"$EV"; read _ <"$GATES/go.$ID"`
	a := h.start(t, environ("EV="+ev.path, "GATES="+g.dir, "ID=a"), append([]string{"barrier", "-n", "2", name}, script(body)...)...)
	etcdtest.AwaitKeys(t, cli, participantsPrefix(name), 1)
	b := h.start(t, environ(), "barrier", "-n", "2", "--verbose", name)
	assert.Equal(t, "run a", ev.next(t, 30*time.Second))
	// b has left (its key is gone); a, the first of the round, leaves last, once its command ends.
	etcdtest.AwaitKeys(t, cli, participantsPrefix(name), 1)
	b.stderr.awaitLine(t, "leaving: waiting until every participant of round 1 has left", 30*time.Second)
	select {
	case <-b.exited:
		t.Fatalf("the participant without a command exited while the other's command ran: %s", b.stderr.text())
	case <-time.After(300 * time.Millisecond):
	}
	g.open(t, "a")
	assert.Equal(t, 0, a.wait(30*time.Second), a.stderr.text())
	assert.Equal(t, 0, b.wait(30*time.Second), b.stderr.text())
	assert.Contains(t, b.stderr.text(), "every participant of round 1 has left")
	assert.Empty(t, b.stdout.text())

	c := h.start(t, environ(), "barrier", "-n", "2", name)
	etcdtest.AwaitKeys(t, cli, participantsPrefix(name), 1)
	require.False(t, exited(c), "the first participant exited alone: %s", c.stderr.text())
	d := h.run(t, environ(), "barrier", "-n", "2", name)
	assert.Equal(t, 0, d.code, d.stderr.text())
	assert.Equal(t, 0, c.wait(30*time.Second), c.stderr.text())
	assert.Empty(t, c.stdout.text()+c.stderr.text()+d.stdout.text()+d.stderr.text())
	noBarrierLeft(t, cli, name)
}

// testBarrierTimeout: a signal while entering is 128+N, its key withdrawn; a participant
// that gives another N than the name's is exit 64; a lone participant of two gives up after
// --timeout with 124 and one line, leaving no key. The signalled participant comes first:
// its key in etcd shows that the name's size was recorded, which a timed-out participant
// may not have done before its deadline on a loaded machine.
func testBarrierTimeout(t *testing.T, h *harness) {
	const name = "cmd-barrier-timeout"
	cli := cluster.Client(t)
	p := h.start(t, environ(), "barrier", "-n", "2", name, "--", "true")
	etcdtest.AwaitKeys(t, cli, participantsPrefix(name), 1)
	p.signal(syscall.SIGTERM)
	assert.Equal(t, exitSignal+int(syscall.SIGTERM), p.wait(30*time.Second), p.stderr.text())
	assertOneLine(t, p.stderr.text(), `etcdsync barrier: SIGTERM while entering barrier "`+name+`"`)
	assert.Zero(t, etcdtest.CountKeys(t, cli, participantsPrefix(name)))

	p = h.run(t, environ(), "barrier", "-n", "3", name, "--", "true")
	assert.Equal(t, exitUsage, p.code, p.stderr.text())
	assertOneLine(t, p.stderr.text(), "etcdsync barrier: -n 3: ")
	assert.Contains(t, p.stderr.text(), "has 2 participants, not 3")

	p = h.run(t, environ(), "barrier", "-n", "2", "--timeout", "1s", name, "--", "true")
	assert.Equal(t, exitTimeout, p.code, p.stderr.text())
	assertOneLine(t, p.stderr.text(), `etcdsync barrier: barrier "`+name+`": 2 participants had not entered within 1s`)
	noBarrierLeft(t, cli, name)
}

// testBarrierLoss: when the participant's lease is revoked while its command runs, the
// command gets SIGTERM and etcdsync exits 125 with one line, whatever the command's status.
func testBarrierLoss(t *testing.T, h *harness) {
	const name = "cmd-barrier-loss"
	cli := cluster.Client(t)
	ev := newEvents(t)
	body := `trap 'echo term >"$EV"; exit 0' TERM; echo start >"$EV"; ` + waitLoop
	p := h.start(t, environ("EV="+ev.path), append([]string{"barrier", "-n", "1", "--grace", "5s", name}, script(body)...)...)
	assert.Equal(t, "start", ev.next(t, 30*time.Second))
	resp, err := cli.Get(etcdtest.Context(t), participantsPrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	_, err = cli.Revoke(etcdtest.Context(t), clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	assert.Equal(t, "term", ev.next(t, 30*time.Second))
	assert.Equal(t, exitLost, p.wait(30*time.Second), p.stderr.text())
	assertOneLine(t, p.stderr.text(), `etcdsync barrier: barrier "`+name+`" lost while the command ran`)
	noBarrierLeft(t, cli, name)
}

// latchRun runs `etcdsync latch NAME args...` to its end.
func latchRun(t *testing.T, h *harness, name string, args ...string) *process {
	t.Helper()
	return h.run(t, environ(), append([]string{"latch", name}, args...)...)
}

// testLatchCountsDown: a waiter started before the --set waits for it, then for zero; a
// participant that counts down twice --as the same ID counts once; the waiters exit 0 at
// zero, and --count follows the count.
func testLatchCountsDown(t *testing.T, h *harness) {
	const name = "cmd-latch"
	cli := cluster.Client(t)
	count := func(want string) {
		t.Helper()
		p := latchRun(t, h, name, "--count")
		assert.Equal(t, 0, p.code, p.stderr.text())
		assert.Equal(t, want+"\n", p.stdout.text())
	}
	early := h.start(t, environ(), "latch", name, "--wait")
	p := latchRun(t, h, name, "--set", "2")
	require.Equal(t, 0, p.code, p.stderr.text())
	late := h.start(t, environ(), "latch", "--wait", name)
	count("2")
	for range 2 {
		p = latchRun(t, h, name, "--down", "--as", "a")
		assert.Equal(t, 0, p.code, p.stderr.text())
	}
	count("1")
	p = h.run(t, environ(), "status", name)
	assert.Equal(t, 0, p.code, p.stderr.text())
	assert.Equal(t, name+": latch, count 1 of 2\n", p.stdout.text(), "status")
	require.False(t, exited(early), "a waiter exited at 1: %s", early.stderr.text())
	require.False(t, exited(late), "a waiter exited at 1: %s", late.stderr.text())
	p = latchRun(t, h, name, "--down")
	assert.Equal(t, 0, p.code, p.stderr.text())
	assert.Equal(t, 0, early.wait(30*time.Second), early.stderr.text())
	assert.Equal(t, 0, late.wait(30*time.Second), late.stderr.text())
	count("0")
	p = latchRun(t, h, name, "--wait") // at zero: at once
	assert.Equal(t, 0, p.code, p.stderr.text())
	p = latchRun(t, h, name, "--down") // at zero: nothing changes
	assert.Equal(t, 0, p.code, p.stderr.text())
	count("0")
	p = latchRun(t, h, name, "--delete")
	assert.Equal(t, 0, p.code, p.stderr.text())
	assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(name)), "keys of the latch left after --delete")
}

// testLatchSetAndNotSet: a second --set is exit 1 and changes nothing; --down and --count of
// a latch not set are exit 1, one line, nothing written; --prefix puts the keys under it.
func testLatchSetAndNotSet(t *testing.T, h *harness) {
	const name = "cmd-latch-once"
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	for _, args := range [][]string{{"--down"}, {"--down", "--as", "a"}, {"--count"}} {
		p := latchRun(t, h, name, args...)
		assert.Equal(t, exitFree, p.code, "%q: %s", args, p.stderr.text())
		assertOneLine(t, p.stderr.text(), `etcdsync latch: latch "`+name+`" is not set`)
		assert.Empty(t, p.stdout.text())
	}
	for _, w := range etcdtest.Writes(t, cli, before) { // other subtests write beside it
		assert.NotContains(t, w, " "+core.NamePrefix(name), "a count down of a latch not set wrote")
	}
	p := latchRun(t, h, name, "--set", "3")
	require.Equal(t, 0, p.code, p.stderr.text())
	p = latchRun(t, h, name, "--set", "5")
	assert.Equal(t, exitFree, p.code, p.stderr.text())
	assertOneLine(t, p.stderr.text(), `etcdsync latch: latch "`+name+`" is set already: nothing changed`)
	p = latchRun(t, h, name, "--count")
	assert.Equal(t, "3\n", p.stdout.text(), p.stderr.text())
	p = latchRun(t, h, name, "--delete")
	assert.Equal(t, 0, p.code, p.stderr.text())
	p = latchRun(t, h, name, "--count")
	assert.Equal(t, exitFree, p.code, p.stderr.text())

	p = latchRun(t, h, name, "--prefix", "app/", "--set", "1")
	require.Equal(t, 0, p.code, p.stderr.text())
	assert.Equal(t, int64(1), etcdtest.CountKeys(t, cli, "app/"+core.NamePrefix(name)))
	assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(name)))
	p = latchRun(t, h, name, "--prefix", "app/", "--delete")
	assert.Equal(t, 0, p.code, p.stderr.text())
	assert.Zero(t, etcdtest.CountKeys(t, cli, "app/"+core.NamePrefix(name)))
}

// testLatchWaitTimeoutAndDeletion: --wait gives up after --timeout with 124 and one line;
// a waiter whose latch is deleted above zero exits 1.
func testLatchWaitTimeoutAndDeletion(t *testing.T, h *harness) {
	const name = "cmd-latch-wait"
	cli := cluster.Client(t)
	p := latchRun(t, h, name, "--wait", "--timeout", "300ms") // not set: waits for the --set
	assert.Equal(t, exitTimeout, p.code, p.stderr.text())
	assertOneLine(t, p.stderr.text(), `etcdsync latch: latch "`+name+`" not at zero within 300ms`)
	p = latchRun(t, h, name, "--set", "1")
	require.Equal(t, 0, p.code, p.stderr.text())
	p = latchRun(t, h, name, "--wait", "--timeout", "300ms")
	assert.Equal(t, exitTimeout, p.code, p.stderr.text())

	// The waiter may read the latch after a delete, and then wait for a --set: the latch is
	// set and deleted again until the waiter has seen a deletion.
	waiter := h.start(t, environ(), "latch", name, "--wait")
	for i := 0; ; i++ {
		require.Less(t, i, 20, "the waiter never saw the latch deleted: %s", waiter.stderr.text())
		if i > 0 {
			p = latchRun(t, h, name, "--set", "1")
			require.Equal(t, 0, p.code, p.stderr.text())
		}
		p = latchRun(t, h, name, "--delete")
		require.Equal(t, 0, p.code, p.stderr.text())
		select {
		case <-waiter.exited:
		case <-time.After(time.Second):
			continue
		}
		break
	}
	assert.Equal(t, exitFree, waiter.wait(30*time.Second), waiter.stderr.text())
	assertOneLine(t, waiter.stderr.text(), `etcdsync latch: latch "`+name+`" was deleted while its count was above zero`)
	assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(name)))
}

// testBarrierLatchBadInput: bad flags, actions and names end with 64 and one line on stderr
// that names the problem, and write nothing to etcd.
func testBarrierLatchBadInput(t *testing.T, h *harness) {
	const name = "cmd-bad-barrier-latch"
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"barrier", name, "--", "true"}, "etcdsync barrier: -n N missing"},
		{[]string{"barrier", "-n", "0", name, "--", "true"}, "etcdsync barrier: -n 0: from 1 to 100000 participants"},
		{[]string{"barrier", "-n", "100001", name}, "etcdsync barrier: -n 100001: from 1 to 100000 participants"},
		{[]string{"barrier", "-n", "2"}, "etcdsync barrier: NAME missing"},
		{[]string{"barrier", "-n", "2", "--try", name}, "etcdsync barrier: unknown flag --try (etcdsync barrier --help)"},
		{[]string{"barrier", "-n", "2", "--shell", name}, "etcdsync barrier: --shell without a command"},
		{[]string{"barrier", "-n", "2", "--command-failed", "64", name, "--", "true"}, "etcdsync barrier: --command-failed 64: "},
		{[]string{"barrier", "-n", "2", "--timeout", "-1s", name}, "etcdsync barrier: --timeout -1s is negative"},
		{[]string{"barrier", "-n", "2", "--prefix", "app", name}, `etcdsync barrier: --prefix "app" does not end with '/'`},
		{[]string{"barrier", "-n", "2", "--ttl", "500ms", name}, "invalid option: TTL 500ms is under 1s"},
		{[]string{"barrier", "-n", "2", "a\nb", "--", "true"}, `etcdsync barrier: invalid name "a\nb": it holds U+000A`},
		{[]string{"barrier", "-n", "2", "", "--", "true"}, "etcdsync barrier: invalid name: empty"},
		{[]string{"latch", name}, "etcdsync latch: no action: --set N, --down, --wait, --count or --delete"},
		{[]string{"latch", name, "--set", "2", "--down"}, "etcdsync latch: --set and --down: one action at a time"},
		{[]string{"latch", name, "--wait", "--count", "--delete"}, "etcdsync latch: --wait and --count and --delete: one action at a time"},
		{[]string{"latch", name, "--set", "0"}, "etcdsync latch: --set 0: from 1 to 1000000"},
		{[]string{"latch", name, "--set", "1000001"}, "etcdsync latch: --set 1000001: from 1 to 1000000"},
		{[]string{"latch", name, "--wait", "--as", "a"}, "etcdsync latch: --as names who counts down: with --down only"},
		{[]string{"latch", name, "--down", "--as", ""}, "etcdsync latch: --as: invalid name: empty"},
		{[]string{"latch", name, "--count", "--timeout", "1s"}, "etcdsync latch: --timeout bounds --wait only"},
		{[]string{"latch", name, "--wait", "--timeout", "-1s"}, "etcdsync latch: --timeout -1s is negative"},
		{[]string{"latch", "--wait"}, "etcdsync latch: one NAME, the latch's, expected; got 0"},
		{[]string{"latch", name, name, "--wait"}, "etcdsync latch: one NAME, the latch's, expected; got 2"},
		{[]string{"latch", "", "--wait"}, "etcdsync latch: invalid name: empty"},
		{[]string{"latch", name, "--count", "--prefix", "app"}, `etcdsync latch: --prefix "app" does not end with '/'`},
	} {
		p := h.run(t, environ(), tc.args...)
		assert.Equal(t, exitUsage, p.code, "%q: %s", tc.args, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync")
		assert.Contains(t, p.stderr.text(), tc.stderr, "%q", tc.args)
		assert.NotContains(t, p.stderr.text(), ": etcdsync: ", "%q: the prefix stutters", tc.args)
		assert.Empty(t, p.stdout.text(), "%q", tc.args)
	}
	for _, w := range etcdtest.Writes(t, cli, before) { // other subtests write beside it
		assert.NotContains(t, w, " "+core.NamePrefix(name), "a refused command wrote")
	}
}

// testBarrierLatchUnreachable: an etcd that does not answer within --dial-timeout is exit 69,
// one line, for barrier and for every action of latch.
func testBarrierLatchUnreachable(t *testing.T, h *harness) {
	unreachable := []string{"--endpoints", "127.0.0.1:1", "--dial-timeout", "300ms"}
	for _, args := range [][]string{
		{"barrier", "-n", "2", "cmd-unreachable", "--", "true"},
		{"barrier", "-n", "1", "cmd-unreachable"},
		{"latch", "cmd-unreachable", "--set", "1"},
		{"latch", "cmd-unreachable", "--down"},
		{"latch", "cmd-unreachable", "--wait"},
		{"latch", "cmd-unreachable", "--count"},
		{"latch", "cmd-unreachable", "--delete"},
	} {
		p := h.run(t, environ(), append(append([]string{args[0]}, unreachable...), args[1:]...)...)
		assert.Equal(t, exitEtcd, p.code, "%q: %s", args, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync "+args[0]+": ")
	}
}

// TestBarrierAndLatchParse: barrier takes NAME and the command after it, with or without
// "--", flags before and after NAME; latch takes one NAME and one action.
func TestBarrierAndLatchParse(t *testing.T) {
	noEnv := &app{getenv: func(string) string { return "" }}
	for _, tc := range []struct {
		args    []string
		command []string
	}{
		{[]string{"-n", "3", "n"}, nil},
		{[]string{"n", "-n", "3", "--", "ls", "-l"}, []string{"ls", "-l"}},
		{[]string{"-n", "3", "n", "ls", "-n", "5"}, []string{"ls", "-n", "5"}},
		{[]string{"-n=3", "--", "n", "ls"}, []string{"ls"}},
	} {
		c := &barrierCommand{}
		require.NoError(t, c.parse(c.define(), tc.args, noEnv), "%q", tc.args)
		assert.Equal(t, "n", c.name, "%q", tc.args)
		assert.Equal(t, 3, c.n, "%q", tc.args)
		assert.Equal(t, tc.command, c.command, "%q", tc.args)
		assert.Equal(t, tc.command, c.runner.command, "%q", tc.args)
		assert.Equal(t, `barrier "n"`, c.runner.what())
	}
	for _, tc := range []struct {
		args   []string
		action string
	}{
		{[]string{"n", "--set", "4"}, "set"},
		{[]string{"--down", "n", "--as", "shard-1"}, "down"},
		{[]string{"n", "--wait", "--timeout", "1m"}, "wait"},
		{[]string{"n", "--count"}, "count"},
		{[]string{"n", "--delete"}, "delete"},
	} {
		c := &latchCommand{}
		require.NoError(t, c.parse(c.define(), tc.args, noEnv), "%q", tc.args)
		assert.Equal(t, "n", c.name, "%q", tc.args)
		assert.Equal(t, tc.action, c.action, "%q", tc.args)
	}
}
