//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testOnceRunsOncePerPeriod: three `etcdsync once --every 1h` started at once, as cron on
// three hosts: one runs its command, with the period in ETCDSYNC_PERIOD; all exit 0. A
// command that fails records nothing, and the next once runs again; `etcdsync delete`
// removes the record.
func testOnceRunsOncePerPeriod(t *testing.T, h *harness) {
	cli := cluster.Client(t)
	ctx := etcdtest.Context(t)
	const name = "cmd-once"
	record := core.OnceRecordKey(core.NamePrefix(name))
	_, err := cli.Delete(ctx, record) // what an earlier -count run left
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "out")
	body := `echo "run $ETCDSYNC_PERIOD" >>"$OUT"`
	var ps []*process
	for range 3 {
		ps = append(ps, h.start(t, environ("OUT="+out), append([]string{"once", "--every", "1h", name}, script(body)...)...))
	}
	for _, p := range ps {
		assert.Equal(t, 0, p.wait(time.Minute), "stderr: %s", p.stderr.text())
	}
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 1, "runs in one period:\n%s", data)
	hour := time.Now().UTC().Truncate(time.Hour)
	period := strings.TrimPrefix(lines[0], "run ")
	assert.Contains(t, []string{hour.Format(time.RFC3339), hour.Add(-time.Hour).Format(time.RFC3339)}, period)
	resp, err := cli.Get(ctx, record)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "no record")
	assert.Contains(t, string(resp.Kvs[0].Value), `"start":"`+period+`"`)

	// A failed command records nothing: on another name, the next once runs again.
	const failing = "cmd-once-failing"
	_, err = cli.Delete(ctx, core.OnceRecordKey(core.NamePrefix(failing)))
	require.NoError(t, err)
	p := h.run(t, environ(), append([]string{"once", "--every", "1h", failing}, script("exit 3")...)...)
	assert.Equal(t, 3, p.code, "stderr: %s", p.stderr.text())
	p = h.run(t, environ("OUT="+out), append([]string{"once", "--every", "1h", failing}, script(body)...)...)
	assert.Equal(t, 0, p.code, "stderr: %s", p.stderr.text())
	data, err = os.ReadFile(out)
	require.NoError(t, err)
	assert.Len(t, strings.Split(strings.TrimSpace(string(data)), "\n"), 2, "the run after a failure did not run:\n%s", data)

	p = h.run(t, environ(), "delete", name, failing)
	assert.Equal(t, 0, p.code, "stderr: %s", p.stderr.text())
	for _, n := range []string{name, failing} {
		resp, err := cli.Get(ctx, core.OnceRecordKey(core.NamePrefix(n)))
		require.NoError(t, err)
		assert.Empty(t, resp.Kvs, "delete left the record of %s", n)
		nothingLeft(t, cli, "", n)
	}
}
