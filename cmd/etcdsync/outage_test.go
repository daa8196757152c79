//go:build unix

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testMajorityOutage stops two of three members, the leader among them (SIGTERM to server
// processes when an etcd server is on PATH, else a graceful stop of embedded members), while
// one etcdsync holds a name with a command and another waits on it. The member left has no
// leader: the holder's hold must end at its local deadline, its command get SIGTERM and
// etcdsync exit 125; the waiter's place in line goes with its lease, and it must take a new
// one once the members are back, instead of exiting 69, and run its command only after the
// holder's command was stopped. Each says what happened in its --verbose log.
func testMajorityOutage(t *testing.T, h *harness) {
	if testing.Short() {
		t.Skip("stops and restarts members of a cluster of its own: not in the short tier")
	}
	start := func() (*etcdtest.Cluster, error) { return etcdtest.NewEmbedded(3) }
	if bin := etcdtest.ServerBinary(); bin != "" {
		start = func() (*etcdtest.Cluster, error) { return etcdtest.NewProcesses(3, bin) }
	}
	c, err := start()
	require.NoError(t, err)
	t.Cleanup(c.Close)
	const name = "cmd-outage"
	ev, dir := newEvents(t), t.TempDir()
	env := environ("ETCDCTL_ENDPOINTS="+strings.Join(c.Endpoints(), ","), "ETCDSYNC_NAMESPACE=", "EV="+ev.path, "D="+dir)

	holderBody := `trap ': >"$D/stopped"; echo stopped >"$EV"; exit 0' TERM; echo holder >"$EV"; sleep 300 & wait`
	holder := h.start(t, env, append([]string{"lock", "--verbose", "--ttl", "3s", "--grace", "2s", "--command-timeout", "1s", name}, script(holderBody)...)...)
	require.Equal(t, "holder", ev.next(t, 30*time.Second))
	waiterBody := `if [ -e "$D/stopped" ]; then echo "waiter after"; else echo "waiter before"; fi >"$EV"`
	waiter := h.start(t, env, append([]string{"lock", "--verbose", "--ttl", "3s", name}, script(waiterBody)...)...)
	cli := c.Client(t)
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), 2)

	leader, err := c.Leader(etcdtest.Context(t))
	require.NoError(t, err)
	down := []int{leader, (leader + 1) % 3}
	for _, i := range down {
		c.Stop(i)
	}
	assert.Equal(t, "stopped", ev.next(t, 30*time.Second), "the holder's command was not stopped")
	assert.Equal(t, exitLost, holder.wait(30*time.Second), holder.stderr.text())
	assert.Contains(t, holder.stderr.text(), "local deadline")
	// The outage lasts until the waiter's lease has run out too (its own local deadline),
	// however soon the holder was gone.
	waiter.stderr.awaitLine(t, "place in line lost", 30*time.Second)
	require.NoError(t, c.RestartAll(down...))
	assert.Equal(t, "waiter after", ev.next(t, time.Minute))
	assert.Equal(t, 0, waiter.wait(30*time.Second), waiter.stderr.text())
	assert.Contains(t, waiter.stderr.text(), "place in line lost")
	nothingLeft(t, cli, "", name)
}
