//go:build unix

package main

import (
	"fmt"
	"net/url"
	"path/filepath"
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

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testLossStopsTheCommand deletes the key of a running command's hold, or revokes its lease:
// the command gets SIGTERM, and etcdsync exits 125 with one line, whatever the command's own
// status; for every kind of hold.
func testLossStopsTheCommand(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev := newEvents(t)
	// The command waits in short sleeps (waitLoop), never in one blocking call of sh's own.
	body := `trap 'echo "term $ID" >"$EV"; exit 0' TERM; echo "start $ETCDSYNC_KEY" >"$EV"; ` + waitLoop
	for _, kind := range kinds {
		for _, how := range []string{"deleted", "revoked"} {
			id := kind + "-" + how
			name := "cmd-loss-" + id
			p := h.start(t, environ("EV="+ev.path, "ID="+id), append(holdArgs(kind, name, "--grace", "2s"), script(body)...)...)
			key, ok := strings.CutPrefix(ev.next(t, 30*time.Second), "start ")
			require.True(t, ok)
			if how == "deleted" {
				_, err := cli.Delete(etcdtest.Context(t), key)
				require.NoError(t, err)
			} else {
				resp, err := cli.Get(etcdtest.Context(t), key)
				require.NoError(t, err)
				require.Len(t, resp.Kvs, 1)
				_, err = cli.Revoke(etcdtest.Context(t), clientv3.LeaseID(resp.Kvs[0].Lease))
				require.NoError(t, err)
			}
			assert.Equal(t, "term "+id, ev.next(t, 30*time.Second))
			assert.Equal(t, exitLost, p.wait(30*time.Second), "%s %s", kind, how)
			assertOneLine(t, p.stderr.text(), "etcdsync "+kind+": ")
			assert.Contains(t, p.stderr.text(), "lost while the command ran")
			nothingLeft(t, cli, "", name)
		}
	}
}

// timeline is what one black-holed run measured, from the two etcdsync's --verbose logs.
type timeline struct {
	cutToLoss         time.Duration // black hole -> the holder's hold ends (its local deadline)
	lossToSignal      time.Duration // -> SIGTERM sent to the holder's command group
	signalToSuccessor time.Duration // -> the successor etcdsync starts its command
}

// testBlackHoledHolder cuts a holder's etcdsync off from etcd (etcd's proxy drops its
// traffic) while another etcdsync waits on the same name. The holder's hold ends at its
// local deadline, before etcd lets its lease expire: its command must get SIGTERM before the
// successor's command starts, in every run. The successor's command checks that the
// holder's command ran its SIGTERM trap before it started. The timelines are logged.
func testBlackHoledHolder(t *testing.T, h *harness) {
	runs := 6
	if testing.Short() {
		runs = 2
	}
	var mu sync.Mutex
	var got []timeline
	t.Run("runs", func(t *testing.T) {
		for i := range runs {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				tl := blackHoledRun(t, h, fmt.Sprintf("cmd-blackhole-%d", i))
				mu.Lock()
				got = append(got, tl)
				mu.Unlock()
			})
		}
	})
	if len(got) == 0 {
		return
	}
	stat := func(what string, of func(timeline) time.Duration) {
		var ds []time.Duration
		for _, tl := range got {
			ds = append(ds, of(tl))
		}
		slices.Sort(ds)
		t.Logf("%-32s min %-10v median %-10v max %-10v (%d runs, TTL 2s)", what, ds[0], ds[len(ds)/2], ds[len(ds)-1], len(ds))
	}
	stat("black hole -> hold lost:", func(tl timeline) time.Duration { return tl.cutToLoss })
	stat("hold lost -> SIGTERM sent:", func(tl timeline) time.Duration { return tl.lossToSignal })
	stat("SIGTERM -> successor starts:", func(tl timeline) time.Duration { return tl.signalToSuccessor })
}

func blackHoledRun(t *testing.T, h *harness, name string) timeline {
	target, err := url.Parse(cluster.Endpoints()[0])
	require.NoError(t, err)
	proxy, err := etcdtest.NewProxy(*target)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() }) // after the holder's cleanup: it waits for its connections
	ev, dir := newEvents(t), t.TempDir()
	env := environ("EV="+ev.path, "D="+dir)
	through := proxy.URL()

	holderBody := `trap ': >"$D/stopped"; echo stopped >"$EV"; exit 0' TERM; echo holder >"$EV"; sleep 300 & wait`
	holder := h.start(t, env, append([]string{"lock", "--verbose", "--ttl", "2s", "--command-timeout", "1s",
		"--endpoints", through.String(), name}, script(holderBody)...)...)
	require.Equal(t, "holder", ev.next(t, 30*time.Second))

	successorBody := `if [ -e "$D/stopped" ]; then echo "successor after"; else echo "successor before"; fi >"$EV"`
	successor := h.start(t, env, append([]string{"lock", "--verbose", name}, script(successorBody)...)...)
	cli := cluster.Client(t)
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)

	cut := time.Now()
	proxy.Blackhole()
	assert.Equal(t, "stopped", ev.next(t, 30*time.Second))
	assert.Equal(t, "successor after", ev.next(t, 30*time.Second), "the successor's command started before the holder's command ran its SIGTERM trap")
	assert.Equal(t, 0, successor.wait(30*time.Second), successor.stderr.text())
	proxy.Restore()
	assert.Equal(t, exitLost, holder.wait(30*time.Second), holder.stderr.text())
	nothingLeft(t, cli, "", name)

	lost := logTime(t, holder, `": lost: `)
	signalled := logTime(t, holder, "sent SIGTERM to process group")
	started := logTime(t, successor, ": starting ")
	require.True(t, signalled.Before(started), "SIGTERM at %v, the successor's command started at %v", signalled, started)
	tl := timeline{cutToLoss: lost.Sub(cut), lossToSignal: signalled.Sub(lost), signalToSuccessor: started.Sub(signalled)}
	t.Logf("black hole -> lost %v, lost -> SIGTERM %v, SIGTERM -> successor starts %v", tl.cutToLoss, tl.lossToSignal, tl.signalToSuccessor)
	return tl
}

// logTime is the time of p's first --verbose line that contains what.
func logTime(t *testing.T, p *process, what string) time.Time {
	t.Helper()
	for line := range strings.SplitSeq(p.stderr.text(), "\n") {
		if strings.Contains(line, what) {
			stamp, _, _ := strings.Cut(line, " ")
			at, err := time.Parse(time.RFC3339Nano, stamp)
			require.NoError(t, err, line)
			return at
		}
	}
	t.Fatalf("no log line with %q in:\n%s", what, p.stderr.text())
	return time.Time{}
}

// testNoProcessOutlives: the processes a command started in its group (with --shell, through
// sh -c) are gone when etcdsync exits, also those that ignore SIGTERM (SIGKILL after
// --grace), and the hold is released only once they are.
func testNoProcessOutlives(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev, dir := newEvents(t), t.TempDir()
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "ready"), 0o600))
	cases := []struct {
		name   string
		script string
		lose   bool // delete the hold's key once the command runs
		want   int
		grace  time.Duration // the least etcdsync must have waited, for SIGKILL
	}{
		{"on loss", `sleep 300 & echo "bg $!" >"$EV"; echo "key $ETCDSYNC_KEY" >"$EV"; wait`, true, exitLost, 0},
		{"left behind", `sleep 300 & echo "bg $!" >"$EV"; echo "key $ETCDSYNC_KEY" >"$EV"; exit 0`, false, 0, 0},
		{"ignoring SIGTERM", `(trap "" TERM; echo >"$D/ready"; exec sleep 300) & echo "bg $!" >"$EV"; echo "key $ETCDSYNC_KEY" >"$EV"; read _ <"$D/ready"; exit 4`, false, 4, 500 * time.Millisecond},
	}
	for i, tc := range cases {
		name := fmt.Sprintf("cmd-group-%d", i)
		start := time.Now()
		p := h.start(t, environ("EV="+ev.path, "D="+dir), "lock", "--verbose", "--shell", "--grace", "500ms", name, "--", tc.script)
		bg, err := strconv.Atoi(strings.TrimPrefix(ev.next(t, 30*time.Second), "bg "))
		require.NoError(t, err)
		key := strings.TrimPrefix(ev.next(t, 30*time.Second), "key ")
		if tc.lose {
			_, err := cli.Delete(etcdtest.Context(t), key)
			require.NoError(t, err)
		}
		assert.Equal(t, tc.want, p.wait(30*time.Second), "%s: %s", tc.name, p.stderr.text())
		assert.False(t, alive(bg), "%s: the background process %d outlived etcdsync", tc.name, bg)
		assert.GreaterOrEqual(t, time.Since(start), tc.grace, tc.name)
		if !tc.lose { // a lost hold is not released: it has ended
			gone, released := logTime(t, p, "is gone"), logTime(t, p, ": released")
			assert.True(t, gone.Before(released), "%s: released before the group was gone", tc.name)
		}
		nothingLeft(t, cli, "", name)
	}
}

// testSignalsArePassedOn sends SIGINT, SIGTERM and SIGHUP to etcdsync: its command gets it;
// etcdsync releases once the command has exited, and exits 128+N: the stop was asked for,
// also when the command caught the signal and exited 0.
func testSignalsArePassedOn(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ev := newEvents(t)
	trapped := `trap 'echo "got INT" >"$EV"; exit 0' INT; trap 'echo "got TERM" >"$EV"; exit 0' TERM
trap 'echo "got HUP" >"$EV"; exit 0' HUP; echo start >"$EV"; ` + waitLoop
	plain := `echo start >"$EV"; ` + waitLoop
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		for _, trap := range []bool{true, false} {
			name := fmt.Sprintf("cmd-signal-%d-%t", sig, trap)
			body, want := plain, exitSignal+int(sig)
			if trap {
				body = trapped
			}
			p := h.start(t, environ("EV="+ev.path), append([]string{"lock", "--grace", "2s", name}, script(body)...)...)
			require.Equal(t, "start", ev.next(t, 30*time.Second))
			p.signal(sig)
			if trap {
				assert.Equal(t, "got "+strings.TrimPrefix(signame(sig), "SIG"), ev.next(t, 30*time.Second))
			}
			assert.Equal(t, want, p.wait(30*time.Second), "%v trapped=%t: %s", sig, trap, p.stderr.text())
			assert.Empty(t, p.stderr.text())
			nothingLeft(t, cli, "", name)
		}
	}
}

// testSignalWhileWaiting: a signal to an etcdsync that waits ends the wait with 128+N and one
// line, and its key is gone.
func testSignalWhileWaiting(t *testing.T, h *harness) {
	const name = "cmd-signal-waiting"
	cli := cluster.Client(t)
	holder := h.start(t, environ(), "lock", name)
	holder.stdout.awaitLine(t, "ETCDSYNC_TOKEN=", 30*time.Second)
	waiter := h.start(t, environ(), "lock", name, "--", "true")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)
	waiter.signal(syscall.SIGTERM)
	assert.Equal(t, exitSignal+int(syscall.SIGTERM), waiter.wait(30*time.Second))
	assertOneLine(t, waiter.stderr.text(), `etcdsync lock: SIGTERM while waiting for lock "cmd-signal-waiting"`)
	assert.Len(t, keysOf(t, cli, "", name), 1)
	holder.signal(syscall.SIGHUP)
	assert.Equal(t, 0, holder.wait(30*time.Second))
	nothingLeft(t, cli, "", name)
}

// waitLoop is how a test's command waits for a signal: in sleeps of 0.1 s, after each of
// which sh runs the traps of the signals that came. Waiting in one call of sh's own (read
// from a FIFO that never opens, wait for a background job) loses a trapped signal that
// arrives after sh has last looked for one and before the call blocks: the call then
// blocks for good (seen once in TestCommand/SignalsArePassedOnToTheCommand under load). A
// sleep child gets the signal too, as a member of the group, and dies of it; sh's report of
// that ("Terminated") goes to /dev/null with the loop's stderr.
const waitLoop = `while :; do sleep 0.1; done 2>/dev/null`
