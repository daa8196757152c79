package fencetest

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestTheShellFenceOfTheDocs runs docs/fencing.md's report.sh with psql, as `etcdsync lock`
// would with ETCDSYNC_TOKEN, for a holder and then its successor, both by a mutex here: the
// successor's run writes, and the first holder's late run fails and writes nothing.
func TestTheShellFenceOfTheDocs(t *testing.T) {
	db := postgres.newDatabase(t)
	ctx := etcdtest.Context(t)
	table(t, db, "")
	_, err := db.ExecContext(ctx, "CREATE TABLE reports (day date PRIMARY KEY, written_by bigint NOT NULL)")
	require.NoError(t, err)
	script := filepath.Join(t.TempDir(), "report.sh")
	require.NoError(t, os.WriteFile(script, []byte(docScript(t)), 0o755))
	bin, err := postgresBinDir()
	require.NoError(t, err)
	u, err := url.Parse(db.dsn)
	require.NoError(t, err)
	run := func(token int64) (string, error) {
		cmd := exec.CommandContext(ctx, script)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "PGHOST="+u.Hostname(), "PGPORT="+u.Port(),
			"PGUSER=postgres", "PGDATABASE="+strings.TrimPrefix(u.Path, "/"), "ETCDSYNC_TOKEN="+strconv.FormatInt(token, 10))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	writtenBy := func() int64 {
		var tok int64
		require.NoError(t, db.QueryRowContext(ctx, "SELECT written_by FROM reports").Scan(&tok))
		return tok
	}

	first, err := mutex.New(cluster.Client(t), "nightly-report")
	require.NoError(t, err)
	require.NoError(t, first.Lock(ctx))
	token := first.Token()
	out, err := run(token)
	require.NoError(t, err, out)
	assert.Equal(t, token, writtenBy())
	require.NoError(t, first.Unlock(ctx)) // stands for the loss the first holder does not see

	next, err := mutex.New(cluster.Client(t), "nightly-report")
	require.NoError(t, err)
	require.NoError(t, next.Lock(ctx))
	nextToken := next.Token()
	out, err = run(nextToken)
	require.NoError(t, err, out)
	out, err = run(nextToken) // the holder writes again
	require.NoError(t, err, out)
	assert.Equal(t, nextToken, writtenBy())
	require.NoError(t, next.Unlock(ctx))

	out, err = run(token) // the first holder, late
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, out)
	assert.Equal(t, 3, exit.ExitCode(), out) // psql's for an error under ON_ERROR_STOP
	assert.Contains(t, out, `no rows returned for \gset`)
	assert.Equal(t, nextToken, writtenBy())
}

// docScript returns docs/fencing.md's shell script: the sh block that starts "#!/bin/sh".
func docScript(t *testing.T) string {
	doc, err := os.ReadFile("../../../docs/fencing.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(doc), "```sh\n#!/bin/sh\n")
	require.True(t, ok, "no sh block starting #!/bin/sh in docs/fencing.md")
	script, _, ok := strings.Cut(after, "```")
	require.True(t, ok)
	return "#!/bin/sh\n" + script
}
