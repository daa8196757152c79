//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// TestCommand builds the etcdsync binary once and runs it, as real processes, against the
// test cluster: one subtest per behaviour, in parallel, each on names of its own.
func TestCommand(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name string
		test func(*testing.T, *harness)
	}{
		{"LocksExcludeEachOther", testLocksExcludeEachOther},
		{"SemaphoreRunsAtMostN", testSemaphoreRunsAtMostN},
		{"SemaphoreUnitsAreTakenTogether", testSemaphoreUnits},
		{"SetLimitStartsTheWaitersThatNowFit", testSetLimit},
		{"ElectionHandsOverWhenTheLeaderExits", testElectionHandsOver},
		{"ElectLoopRunsAgainAfterAnExit0AndALoss", testElectLoop},
		{"TransferMovesTheLeadership", testTransfer},
		{"TransferToAGoneCandidateChangesNothing", testTransferToAGoneCandidate},
		{"TransferGivenUpLeadsOn", testTransferGivenUpLeadsOn},
		{"ElectPreferTakesOverAfterSettle", testElectPrefer},
		{"ExitStatusIsTheCommands", testExitStatusIsTheCommands},
		{"TimeoutAndBusyHaveCodesOfTheirOwn", testTimeoutAndBusy},
		{"TheCommandSeesNameKeyAndToken", testChildEnvironment},
		{"HoldWithoutACommand", testHoldWithoutACommand},
		{"LockOfSeveralNamesHoldsThemAtOnce", testLockOfSeveralNames},
		{"NamespaceKeepsEveryKeyInside", testNamespace},
		{"ALossStopsTheCommand", testLossStopsTheCommand},
		{"MaxHoldStopsTheCommand", testMaxHoldStopsTheCommand},
		{"MaxHoldReleasesOnceTheGroupIsGone", testMaxHoldReleasesOnceTheGroupIsGone},
		{"AskStopsACommandThatYields", testAskStopsACommandThatYields},
		{"ElectTakesAProposalAsEtcdctlElect", testElectProposal},
		{"OnceRunsOncePerPeriod", testOnceRunsOncePerPeriod},
		{"LockDelayAfterAKilledHolder", testLockDelayAfterAKilledHolder},
		{"DetachRenewAndReleaseATicket", testDetachRenewRelease},
		{"ABlackHoledHolderStopsItsCommandBeforeTheSuccessorStarts", testBlackHoledHolder},
		{"AMajorityOutageStopsTheCommandAndTheWaiterWaitsOn", testMajorityOutage},
		{"NoProcessOfTheGroupOutlivesEtcdsync", testNoProcessOutlives},
		{"SignalsArePassedOnToTheCommand", testSignalsArePassedOn},
		{"AStopEscalatesToSIGKILLAfterGrace", testStopEscalatesAfterGrace},
		{"ASecondSignalKillsAtOnce", testSecondSignalKills},
		{"CommandFailedMapsTheCommandsStatus", testCommandFailed},
		{"AWaiterWhoseKeyOrLeaseIsRemovedWaitsAgain", testRemovedWaiterWaitsAgain},
		{"ASignalWhileWaitingLeavesNoKey", testSignalWhileWaiting},
		{"StatusShowsEveryKind", testStatusGolden},
		{"StatusWatchFollowsChanges", testStatusWatch},
		{"StatusCheckIsAnExitStatus", testStatusCheck},
		{"ReleaseByTokenEndsThatHold", testRelease},
		{"AnotherKindsNameIsExit64UntilDeleted", testOtherKindAndDelete},
		{"EtcdLayoutSharesEtcdsKeys", testEtcdLayout},
		{"StatusWithoutNameFindsEveryNameAtTheRoot", testStatusFindsEveryName},
		{"BadInputIsOneLineAndWritesNothing", testBadInput},
		{"HelpOfEverySubcommand", testHelp},
		{"UnreachableEtcdIsExit69", testUnreachableEtcd},
		{"ConnectionFlagsMayComeBeforeTheCommand", testConnectionFlagsFirst},
		{"EndpointsOfTwoClustersAreExit69", testTwoClustersIsExit69},
		{"LoginAsEtcdctlDoes", testLogin},
		{"TLSAsEtcdctlDoes", testTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, h)
		})
	}
}

// testLocksExcludeEachOther runs four `etcdsync lock` at once whose commands append five
// lines each, one at a time, to one file: the lines of one never come between another's.
func testLocksExcludeEachOther(t *testing.T, h *harness) {
	const name, runs, lines = "cmd-exclusion", 4, 5
	out := filepath.Join(t.TempDir(), "out")
	body := `for i in 1 2 3 4 5; do echo "$ID $i" >>"$OUT"; sleep 0.02; done`
	var ps []*process
	for i := range runs {
		ps = append(ps, h.start(t, environ("OUT="+out, "ID="+strconv.Itoa(i)), append([]string{"lock", name}, script(body)...)...))
	}
	for _, p := range ps {
		assert.Equal(t, 0, p.wait(time.Minute), "stderr: %s", p.stderr.text())
	}
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	got := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, got, runs*lines, "%s", data)
	seen := map[string]bool{}
	for b := 0; b < runs; b++ {
		id, _, _ := strings.Cut(got[b*lines], " ")
		assert.False(t, seen[id], "%s ran twice: %s", id, data)
		seen[id] = true
		for i := range lines {
			assert.Equal(t, fmt.Sprintf("%s %d", id, i+1), got[b*lines+i], "interleaved:\n%s", data)
		}
	}
	nothingLeft(t, cluster.Client(t), "", name)
}

// testSemaphoreRunsAtMostN starts six `etcdsync sem -n 3` whose commands each wait at a gate:
// three start, the others wait in line until one of the three ends, and never more than
// three run at once.
func testSemaphoreRunsAtMostN(t *testing.T, h *harness) {
	const name, limit, total = "cmd-sem", 3, 6
	ev, g := newEvents(t), newGates(t)
	body := `echo "start $ID" >"$EV"; read _ <"$GATES/go.$ID"; echo "end $ID" >"$EV"`
	var ps []*process
	for i := range total {
		id := strconv.Itoa(i)
		g.make(t, id)
		env := environ("EV="+ev.path, "GATES="+g.dir, "ID="+id)
		ps = append(ps, h.start(t, env, append([]string{"sem", "-n", strconv.Itoa(limit), name}, script(body)...)...))
	}
	cli := cluster.Client(t)
	var running []string
	finished, releasing, most := 0, false, 0
	for finished < total {
		kind, id, _ := strings.Cut(ev.next(t, time.Minute), " ")
		switch kind {
		case "start":
			running = append(running, id)
			most = max(most, len(running))
			require.LessOrEqual(t, len(running), limit, "commands running at once: %v", running)
		case "end":
			running = slices.DeleteFunc(running, func(r string) bool { return r == id })
			finished++
			releasing = false
		}
		left := total - finished
		if !releasing && len(running) > 0 && len(running) == min(limit, left) {
			// Every etcdsync not done has its permit key: those that do not run wait in line.
			etcdtest.AwaitKeys(t, cli, core.NamePrefix(name)+core.KindPermit, int64(left))
			ev.none(t, "while three hold and the others wait")
			g.open(t, running[0])
			releasing = true
		}
	}
	assert.Equal(t, limit, most)
	for _, p := range ps {
		assert.Equal(t, 0, p.wait(time.Minute), "stderr: %s", p.stderr.text())
	}
	nothingLeft(t, cli, "", name)
}

// testElectionHandsOver runs two `etcdsync elect`: the second leads once the first's command
// exits, with a greater token.
func testElectionHandsOver(t *testing.T, h *harness) {
	const name = "cmd-elect"
	ev, g := newEvents(t), newGates(t)
	body := `echo "lead $ID $ETCDSYNC_TOKEN" >"$EV"; read _ <"$GATES/go.$ID"`
	start := func(id string) *process {
		g.make(t, id)
		env := environ("EV="+ev.path, "GATES="+g.dir, "ID="+id)
		return h.start(t, env, append([]string{"elect", "--value", "candidate-" + id, name}, script(body)...)...)
	}
	a := start("a")
	leadA := strings.Fields(ev.next(t, 30*time.Second))
	require.Equal(t, []string{"lead", "a"}, leadA[:2])
	b := start("b")
	cli := cluster.Client(t)
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
	ev.none(t, "while a leads")
	st := h.run(t, environ(), "status", name) // the values tell an election: no --kind
	require.Equal(t, 0, st.code, st.stderr.text())
	assert.Contains(t, st.stdout.text(), name+`: election, leader "candidate-a", 1 leading, 1 waiting`)

	g.open(t, "a")
	assert.Equal(t, 0, a.wait(30*time.Second), a.stderr.text())
	leadB := strings.Fields(ev.next(t, 30*time.Second))
	require.Equal(t, []string{"lead", "b"}, leadB[:2])
	tokenA, _ := strconv.ParseInt(leadA[2], 10, 64)
	tokenB, _ := strconv.ParseInt(leadB[2], 10, 64)
	assert.Greater(t, tokenB, tokenA)
	g.open(t, "b")
	assert.Equal(t, 0, b.wait(30*time.Second), b.stderr.text())
	nothingLeft(t, cli, "", name)
}

// testElectProposal: `elect NAME PROPOSAL` campaigns with PROPOSAL as its value and, once
// it leads, prints the leader's key and value as etcdctl elect does; status tells the
// election by the values, PROPOSAL's and the default's (elect's owner, marked as a
// candidate's), and shows the leader and each candidate's value.
func testElectProposal(t *testing.T, h *harness) {
	const name = "cmd-elect-proposal"
	cli := cluster.Client(t)
	ev := newEvents(t)
	leader := h.start(t, environ(), "elect", name, "web-7:8080")
	key := leader.stdout.next(t, 30*time.Second)
	assert.Equal(t, "web-7:8080", leader.stdout.next(t, 30*time.Second))
	keys := keysOf(t, cli, "", name)
	require.Len(t, keys, 1)
	assert.Equal(t, keys[0].key, key)
	assert.Equal(t, "web-7:8080", keys[0].value)

	standby := h.start(t, environ("EV="+ev.path), append([]string{"elect", name}, script(`echo "leads $ETCDSYNC_NAME" >"$EV"`)...)...)
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
	st := h.run(t, environ(), "status", name)
	require.Equal(t, 0, st.code, st.stderr.text())
	lines := strings.Split(st.stdout.text(), "\n")
	require.GreaterOrEqual(t, len(lines), 4, st.stdout.text())
	assert.Equal(t, name+`: election, leader "web-7:8080", 1 leading, 1 waiting`, lines[0])
	assert.Regexp(t, `^  POS +KIND +STATE +KEY +TOKEN +LEASE +TTL +VALUE$`, lines[1])
	assert.Regexp(t, `^  1 +candidate +leads +`+regexp.QuoteMeta(key)+` .* web-7:8080$`, lines[2])
	assert.Regexp(t, `^  2 +candidate +waits +.* host=\S+ pid=\d+ since=\S+ role=candidate$`, lines[3])

	leader.signal(syscall.SIGTERM)
	assert.Equal(t, 0, leader.wait(30*time.Second), leader.stderr.text())
	assert.Equal(t, "leads "+name, ev.next(t, 30*time.Second))
	assert.Equal(t, 0, standby.wait(30*time.Second), standby.stderr.text())
	nothingLeft(t, cli, "", name)
}

// holdArgs is the command line that takes a hold of kind on name: lock, rlock, sem -n 1,
// elect.
func holdArgs(kind, name string, flags ...string) []string {
	args := []string{kind}
	if kind == "sem" {
		args = append(args, "-n", "1")
	}
	return append(append(args, flags...), name)
}

var kinds = []string{"lock", "rlock", "sem", "elect"}

// awaitHeld waits until p, a hold of kind without a command, holds: it has printed its
// hold, the token last, or for elect the leader's key and value as etcdctl elect does.
func awaitHeld(t *testing.T, p *process, kind string) {
	t.Helper()
	if kind == "elect" {
		p.stdout.next(t, 30*time.Second) // the key
		p.stdout.next(t, 30*time.Second) // the value
		return
	}
	p.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
}

// testExitStatusIsTheCommands: etcdsync exits with its command's status, 128+N for a death by
// signal N, 127 and 126 when it cannot run it; every kind of hold.
func testExitStatusIsTheCommands(t *testing.T, h *harness) {
	notExecutable := filepath.Join(t.TempDir(), "not-executable")
	require.NoError(t, os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644))
	cases := []struct {
		name    string
		flags   []string
		command []string
		want    int
		stderr  string // the one line etcdsync writes, if any
	}{
		{"exit 0", nil, script("exit 0"), 0, ""},
		{"exit 3", nil, script("exit 3"), 3, ""},
		{"exit 255", nil, script("exit 255"), 255, ""},
		{"killed by SIGTERM", nil, script("kill -TERM $$"), 143, ""},
		{"killed by SIGKILL", nil, script("kill -KILL $$"), 137, ""},
		{"through --shell", []string{"--shell"}, []string{"--", "exit", "7"}, 7, ""},
		{"not found", nil, []string{"--", "no-such-command-etcdsync"}, exitNotFound, "no-such-command-etcdsync: command not found"},
		{"not executable", nil, []string{"--", notExecutable}, exitCannotRun, "cannot run " + notExecutable},
	}
	cli := cluster.Client(t)
	for _, kind := range kinds {
		for i, tc := range cases {
			name := fmt.Sprintf("cmd-status-%s-%d", kind, i)
			p := h.run(t, environ(), append(holdArgs(kind, name, tc.flags...), tc.command...)...)
			assert.Equal(t, tc.want, p.code, "%s %s: stderr %s", kind, tc.name, p.stderr.text())
			if tc.stderr != "" {
				assertOneLine(t, p.stderr.text(), "etcdsync "+kind+": "+tc.stderr)
			} else {
				assert.Empty(t, p.stderr.text(), "%s %s", kind, tc.name)
			}
			nothingLeft(t, cli, "", name)
		}
	}
}

// testTimeoutAndBusy: --timeout gives up with 124 and --try with 75, one line each, having
// left nothing in etcd; a try on a free name runs the command.
func testTimeoutAndBusy(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	for _, kind := range kinds {
		name := "cmd-busy-" + kind
		var release func()
		if kind == "rlock" { // a reader waits only for a writer: Go's rwmutex takes the write side
			rw, err := rwmutex.New(cli, name)
			require.NoError(t, err)
			require.NoError(t, rw.Lock(etcdtest.Context(t)))
			release = func() { assert.NoError(t, rw.Unlock(etcdtest.Context(t))) }
		} else {
			holder := h.start(t, environ(), holdArgs(kind, name)...)
			awaitHeld(t, holder, kind)
			release = func() {
				holder.signal(syscall.SIGINT)
				assert.Equal(t, 0, holder.wait(30*time.Second), holder.stderr.text())
			}
		}
		p := h.run(t, environ(), append(holdArgs(kind, name, "--timeout", "300ms"), "--", "true")...)
		assert.Equal(t, exitTimeout, p.code, "%s: %s", kind, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync "+kind+": ")
		assert.Contains(t, p.stderr.text(), "not acquired within 300ms")
		if kind != "elect" { // an election has no try
			p = h.run(t, environ(), append(holdArgs(kind, name, "--try"), "--", "true")...)
			assert.Equal(t, exitBusy, p.code, "%s: %s", kind, p.stderr.text())
			assertOneLine(t, p.stderr.text(), "etcdsync "+kind+": ")
			assert.Contains(t, p.stderr.text(), "is busy")

			free := h.run(t, environ(), append(holdArgs(kind, name+"-free", "--try"), "--", "true")...)
			assert.Equal(t, 0, free.code, "%s: %s", kind, free.stderr.text())
			nothingLeft(t, cli, "", name+"-free")
		}
		assert.Len(t, keysOf(t, cli, "", name), 1+2*btoi(kind == "sem"), "%s: only the holder's key (and the limit's two)", kind)
		release()
		nothingLeft(t, cli, "", name)
	}
	// etcd's record is the limit: another -n follows it, with a warning that names both
	// limits and how to change it, and units above it are a usage error.
	holder := h.start(t, environ(), "sem", "-n", "2", "cmd-busy-limit")
	holder.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
	before := etcdtest.Revision(t, cli)
	p := h.run(t, environ(), "sem", "-n", "3", "--units", "3", "cmd-busy-limit", "--", "true")
	assert.Equal(t, exitUsage, p.code, p.stderr.text())
	assert.Equal(t, `etcdsync sem: --units 3: over the limit of 2 that etcd records for semaphore "cmd-busy-limit" (not -n 3: etcd's record is the limit; --set-limit changes it)`+"\n", p.stderr.text())
	for _, w := range etcdtest.Writes(t, cli, before) { // other subtests write beside it
		assert.NotContains(t, w, " "+core.NamePrefix("cmd-busy-limit"), "a refused --units wrote")
	}
	p = h.run(t, environ(), "sem", "-n", "3", "cmd-busy-limit", "--", "true")
	assert.Equal(t, 0, p.code, p.stderr.text())
	assert.Equal(t, `etcdsync sem: warning: semaphore "cmd-busy-limit": etcd records a limit of 2, not -n 3: it runs under 2 (to change it for every user: etcdsync sem --set-limit 3 cmd-busy-limit)`+"\n", p.stderr.text())
	p = h.run(t, environ(), "sem", "-n", "2", "cmd-busy-limit", "--", "true")
	assert.Equal(t, 0, p.code, p.stderr.text())
	assert.Empty(t, p.stderr.text(), "the limit etcd records: no warning")
	holder.signal(syscall.SIGTERM)
	assert.Equal(t, 0, holder.wait(30*time.Second), holder.stderr.text())
	nothingLeft(t, cli, "", "cmd-busy-limit")
}

// testSemaphoreUnits: with 3 units of 4 held by one `sem --units 3`, a `--try` for 2 is busy
// and writes nothing, one for 1 runs; a waiter for 2 is served once the 3 are released.
func testSemaphoreUnits(t *testing.T, h *harness) {
	const name = "cmd-sem-units"
	cli := cluster.Client(t)
	holder := h.start(t, environ(), "sem", "-n", "4", "--units", "3", name)
	out := holder.stdout.awaitLine(t, "ETCDSYNC_KEY=", 30*time.Second)
	assert.Contains(t, out, "/permit/u3/")

	before := etcdtest.Revision(t, cli)
	busy := h.run(t, environ(), "sem", "-n", "4", "--units", "2", "--try", name, "--", "true")
	assert.Equal(t, exitBusy, busy.code, busy.stderr.text())
	for _, w := range etcdtest.Writes(t, cli, before) { // other subtests write beside it
		assert.NotContains(t, w, " "+core.NamePrefix(name), "a busy try of 2 units wrote")
	}
	one := h.run(t, environ(), "sem", "-n", "4", "--units", "1", "--try", name, "--", "true")
	assert.Equal(t, 0, one.code, one.stderr.text())

	waiter := h.start(t, environ(), "sem", "-n", "4", "--units", "2", name, "--", "true")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name)+core.KindPermit, 2)
	holder.signal(syscall.SIGTERM)
	assert.Equal(t, 0, holder.wait(30*time.Second), holder.stderr.text())
	assert.Equal(t, 0, waiter.wait(30*time.Second), waiter.stderr.text())
	nothingLeft(t, cli, "", name)
}

// testSetLimit: with the one permit of a limit of 1 held, a waiting `sem` runs its command
// once `sem --set-limit 2` raised the limit, while the holder still holds; --set-limit
// without a positive N, or with a command, is a usage error that writes nothing.
func testSetLimit(t *testing.T, h *harness) {
	const name = "cmd-set-limit"
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	for _, args := range [][]string{{"--set-limit", "0", name}, {"--set-limit", "2", name, "--", "true"}, {"--set-limit", "2", "--units", "1", name}} {
		p := h.run(t, environ(), append([]string{"sem"}, args...)...)
		assert.Equal(t, exitUsage, p.code, "%v: %s", args, p.stderr.text())
	}
	for _, w := range etcdtest.Writes(t, cli, before) { // other subtests write beside it
		assert.NotContains(t, w, " "+core.NamePrefix(name), "a refused --set-limit wrote")
	}
	holder := h.start(t, environ(), "sem", "-n", "1", name)
	holder.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
	waiter := h.start(t, environ(), "sem", "-n", "1", name, "--", "true")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name)+core.KindPermit, 2)
	set := h.run(t, environ(), "sem", "--set-limit", "2", name)
	assert.Equal(t, 0, set.code, set.stderr.text())
	assert.Equal(t, 0, waiter.wait(30*time.Second), waiter.stderr.text())
	holder.signal(syscall.SIGTERM)
	assert.Equal(t, 0, holder.wait(30*time.Second), holder.stderr.text())
	nothingLeft(t, cli, "", name)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// testChildEnvironment: the command sees the name, its key (under the name's prefix, in its
// kind's range) and its token, the key's create revision, for every kind, with --prefix and
// without, on a name that needs escaping.
func testChildEnvironment(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev, g := newEvents(t), newGates(t)
	body := `printf 'env %s|%s|%s\n' "$ETCDSYNC_NAME" "$ETCDSYNC_KEY" "$ETCDSYNC_TOKEN" >"$EV"; read _ <"$GATES/go.$ID"`
	sub := map[string]string{"lock": "", "rlock": core.KindRead, "sem": core.KindPermit, "elect": ""}
	for _, prefix := range []string{"", "app/"} {
		for _, kind := range kinds {
			name := "cmd-env/a%b c-" + kind
			id := kind + strconv.Itoa(len(prefix))
			g.make(t, id)
			var flags []string
			if prefix != "" {
				flags = []string{"--prefix", prefix}
			}
			env := environ("EV="+ev.path, "GATES="+g.dir, "ID="+id)
			p := h.start(t, env, append(holdArgs(kind, name, flags...), script(body)...)...)
			e, ok := strings.CutPrefix(ev.next(t, 30*time.Second), "env ")
			require.True(t, ok)
			got := strings.Split(e, "|")
			require.Len(t, got, 3)
			assert.Equal(t, name, got[0])
			keyPrefix := prefix + "cmd-env%2Fa%25b c-" + kind + "/" + sub[kind]
			assert.True(t, strings.HasPrefix(got[1], keyPrefix), "%s: key %q not under %q", kind, got[1], keyPrefix)
			keys := keysOf(t, cli, prefix, name)
			require.Len(t, keys, 1+2*btoi(kind == "sem"), "%s", kind)
			held := keys[len(keys)-1] // after a semaphore's limit record
			assert.Equal(t, got[1], held.key)
			assert.Equal(t, strconv.FormatInt(held.rev, 10), got[2], "%s: the token is the key's create revision", kind)
			g.open(t, id)
			assert.Equal(t, 0, p.wait(30*time.Second), p.stderr.text())
			nothingLeft(t, cli, prefix, name)
		}
	}
}

// testHoldWithoutACommand: without a command etcdsync prints the name, key and token, holds
// until a signal, then releases and revokes its lease, exit 0; a loss is exit 125.
func testHoldWithoutACommand(t *testing.T, h *harness) {
	const name = "cmd-hold"
	cli := cluster.Client(t)
	p := h.start(t, environ(), "lock", name)
	out := map[string]string{}
	for range 3 {
		k, v, _ := strings.Cut(p.stdout.next(t, 30*time.Second), "=")
		out[k] = v
	}
	keys := keysOf(t, cli, "", name)
	require.Len(t, keys, 1)
	assert.Equal(t, map[string]string{
		"ETCDSYNC_NAME":  name,
		"ETCDSYNC_KEY":   keys[0].key,
		"ETCDSYNC_TOKEN": strconv.FormatInt(keys[0].rev, 10),
	}, out)
	p.signal(syscall.SIGTERM)
	assert.Equal(t, 0, p.wait(30*time.Second), p.stderr.text())
	nothingLeft(t, cli, "", name)
	// The lease carried this key alone, released: it is let go rather than revoked, so that
	// a waiter with --lock-delay sees a release (see etcdsync.Shutdown).
	ttl, err := cli.TimeToLive(etcdtest.Context(t), keys[0].lease, clientv3.WithAttachedKeys())
	require.NoError(t, err)
	assert.Empty(t, ttl.Keys, "a key left on the lease")

	p = h.start(t, environ(), "sem", "-n", "1", name+"-lost")
	p.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
	keys = keysOf(t, cli, "", name+"-lost")
	require.Len(t, keys, 3) // the limit and its marker, then the permit
	_, err = cli.Delete(etcdtest.Context(t), keys[2].key)
	require.NoError(t, err)
	assert.Equal(t, exitLost, p.wait(30*time.Second))
	assertOneLine(t, p.stderr.text(), `etcdsync sem: semaphore "cmd-hold-lost" lost`)
	nothingLeft(t, cli, "", name+"-lost")
}

// testNamespace: with --namespace (or ETCDSYNC_NAMESPACE) every key goes under the
// namespace, and the command shows and passes on keys without it, as a client wrapped by
// etcd's namespace package sees them.
func testNamespace(t *testing.T, h *harness) {
	const name = "cmd-ns"
	cli := cluster.Client(t)                  // inside the run's namespace on an external cluster
	ns := cluster.Prefix() + "cmd-namespace/" // the flag replaces $ETCDSYNC_NAMESPACE
	p := h.start(t, environ(), "lock", "--namespace", ns, name)
	key := ""
	for range 3 {
		if k, v, _ := strings.Cut(p.stdout.next(t, 30*time.Second), "="); k == "ETCDSYNC_KEY" {
			key = v
		}
	}
	require.True(t, strings.HasPrefix(key, name+"/"), "key %q shown with its namespace", key)
	assert.Empty(t, keysOf(t, cli, "", name), "a key outside the namespace")
	keys := keysOf(t, cli, "cmd-namespace/", name)
	require.Len(t, keys, 1)
	assert.Equal(t, "cmd-namespace/"+key, keys[0].key)
	p.signal(syscall.SIGTERM)
	assert.Equal(t, 0, p.wait(30*time.Second), p.stderr.text())
	nothingLeft(t, cli, "cmd-namespace/", name)
}
