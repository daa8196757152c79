//go:build unix

package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testElectLoop: `elect --loop` runs its command again, in a new term, after the command
// exits 0 and after the leadership is lost (an operator deletes its key: the command is
// stopped), and stops with the command's status when it exits otherwise.
func testElectLoop(t *testing.T, h *harness) {
	const name = "cmd-elect-loop"
	cli := cluster.Client(t)
	ev, dir := newEvents(t), t.TempDir()
	// Each term counts itself before it says so, and then decides from its number alone:
	// the first exits 0, the second and third wait to be stopped, the fourth exits 3.
	body := `trap 'echo stopped >"$EV"; exit 0' TERM; echo x >>"$D/terms"; n=$(wc -l <"$D/terms")
echo "term $ETCDSYNC_TOKEN" >"$EV"
case $n in 1) exit 0 ;; 4) exit 3 ;; esac
sleep 300 & wait`
	p := h.start(t, environ("EV="+ev.path, "D="+dir), append([]string{"elect", "--loop", "--verbose", name}, script(body)...)...)
	term := func() int64 {
		t.Helper()
		tok, ok := strings.CutPrefix(ev.next(t, 30*time.Second), "term ")
		require.True(t, ok)
		n, err := strconv.ParseInt(tok, 10, 64)
		require.NoError(t, err)
		return n
	}
	deleteKey := func() {
		t.Helper()
		_, err := cli.Delete(etcdtest.Context(t), core.NamePrefix(name), clientv3.WithPrefix())
		require.NoError(t, err)
		assert.Equal(t, "stopped", ev.next(t, 30*time.Second))
	}
	first := term() // exits 0
	second := term()
	assert.Greater(t, second, first, "no new term after the command exited 0")
	deleteKey()
	third := term()
	assert.Greater(t, third, second, "no new term after the loss")
	deleteKey()
	assert.Greater(t, term(), third)
	assert.Equal(t, 3, p.wait(30*time.Second), p.stderr.text())
	assert.Contains(t, p.stderr.text(), "campaigning again (--loop)")
	nothingLeft(t, cli, "", name)
}
