package fencetest

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/fence"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// The story: a holder writes under its lock, loses its hold without knowing (an operator
// releases it; or its process is paused until its lease expires), its successor takes the
// lock and writes, and the holder, resuming, writes with its token: refused, and nothing of
// its late transaction is committed.

// TestAHolderReleasedByAnOperatorCannotWriteAfterItsSuccessor: the holder is a mutex in this
// process that does not look at its Done while admin.Release ends its hold.
func TestAHolderReleasedByAnOperatorCannotWriteAfterItsSuccessor(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "")
		createWrites(t, db)
		name := "fencetest/released/" + db.b.name

		holder, err := mutex.New(cluster.Client(t), name)
		require.NoError(t, err)
		require.NoError(t, holder.Lock(ctx))
		token := holder.Token()
		require.NoError(t, fencedWrite(ctx, db, table, name, token, "holder, before"))

		require.NoError(t, admin.Release(ctx, cluster.Client(t), []string{name}, token, "stuck"))
		successor, err := mutex.New(cluster.Client(t), name)
		require.NoError(t, err)
		require.NoError(t, successor.Lock(ctx)) // served by the release
		require.Greater(t, successor.Token(), token)
		require.NoError(t, fencedWrite(ctx, db, table, name, successor.Token(), "successor"))

		err = fencedWrite(ctx, db, table, name, token, "holder, late")
		assert.ErrorIs(t, err, fence.ErrStale)
		assert.ErrorIs(t, err, etcdsync.ErrLost)
		assert.Equal(t, []string{"holder, before", "successor"}, notes(t, db))

		<-holder.Done() // it learns in the end, by etcd's event
		assert.ErrorIs(t, holder.Err(), etcdsync.ErrReleasedByOperator)
		assert.ErrorIs(t, holder.Unlock(ctx), etcdsync.ErrLost)
		require.NoError(t, successor.Unlock(ctx))
	})
}

// TestAPausedHolderCannotWriteAfterItsSuccessor: the holder is a process of its own (this
// test binary, as holderMain), stopped with SIGSTOP after its first write until its lease
// has expired and its successor has written, then continued with SIGCONT; it writes at once.
func TestAPausedHolderCannotWriteAfterItsSuccessor(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "")
		createWrites(t, db)
		name := "fencetest/paused/" + db.b.name

		h := startHolder(t, db, name)
		token, err := strconv.ParseInt(h.expect(t, "token "), 10, 64)
		require.NoError(t, err)
		assert.Equal(t, "ok", h.expect(t, "first: "))

		require.NoError(t, h.cmd.Process.Signal(syscall.SIGSTOP))
		successor, err := mutex.New(cluster.Client(t), name)
		require.NoError(t, err)
		require.NoError(t, successor.Lock(ctx)) // served once the paused holder's lease expires
		require.Greater(t, successor.Token(), token)
		require.NoError(t, fencedWrite(ctx, db, table, name, successor.Token(), "successor"))

		_, err = io.WriteString(h.stdin, "write\n") // read once it runs again
		require.NoError(t, err)
		require.NoError(t, h.cmd.Process.Signal(syscall.SIGCONT))
		assert.Equal(t, "stale", h.expect(t, "late: "))
		require.NoError(t, h.wait())

		assert.Equal(t, []string{"holder, before", "successor"}, notes(t, db))
		require.NoError(t, successor.Unlock(ctx))
	})
}

// holderVariable names the backend a holder process writes to; set, TestMain runs
// holderMain instead of the tests.
const holderVariable = "FENCETEST_HOLDER"

// holder is a holder process started by startHolder.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its standard output, line by line; closed at its end
}

// startHolder starts a holder process of name writing to db; tb's cleanup kills it if it
// is still running.
func startHolder(tb testing.TB, db *database, name string) *holder {
	tb.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), holderVariable+"="+db.b.name, "FENCETEST_DSN="+db.dsn,
		"FENCETEST_ETCD="+strings.Join(cluster.Endpoints(), ","), "FENCETEST_LOCK="+name)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	h := &holder{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = h.wait()
		}
	})
	return h
}

// wait reads the holder's output to its end, then waits for it to exit.
func (h *holder) wait() error {
	for range h.lines {
	}
	return h.cmd.Wait()
}

// expect returns the rest of the holder's next line, which must start with prefix.
func (h *holder) expect(tb testing.TB, prefix string) string {
	tb.Helper()
	select {
	case line, ok := <-h.lines:
		require.True(tb, ok, "the holder ended before saying %q", prefix)
		require.True(tb, strings.HasPrefix(line, prefix), "the holder said %q, not %q...", line, prefix)
		return strings.TrimPrefix(line, prefix)
	case <-time.After(time.Minute):
		tb.Fatalf("the holder did not say %q within a minute", prefix)
		return ""
	}
}

// holderMain is a holder process: it locks FENCETEST_LOCK on the etcd at FENCETEST_ETCD with
// a lease of 1 s, writes once fenced by its token, then waits for a line on its standard
// input and writes again with the same token, saying how each went.
func holderMain() int {
	if err := runHolder(); err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	return 0
}

func runHolder() error {
	var b *backend
	for _, candidate := range backends {
		if candidate.name == os.Getenv(holderVariable) {
			b = candidate
		}
	}
	if b == nil {
		return fmt.Errorf("no backend %q", os.Getenv(holderVariable))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv("FENCETEST_ETCD"), ","),
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	sqlDB, err := sql.Open(b.driver, os.Getenv("FENCETEST_DSN"))
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	db := &database{DB: sqlDB, b: b}
	table, err := fence.NewTable(b.dialect, "")
	if err != nil {
		return err
	}
	name := os.Getenv("FENCETEST_LOCK")
	m, err := mutex.New(cli, name, mutex.WithTTL(time.Second))
	if err != nil {
		return err
	}
	if err := m.Lock(ctx); err != nil {
		return err
	}
	token := m.Token()
	fmt.Printf("token %d\n", token)
	say := func(what string, err error) {
		switch {
		case err == nil:
			fmt.Printf("%s: ok\n", what)
		case errors.Is(err, fence.ErrStale):
			fmt.Printf("%s: stale\n", what)
		default:
			fmt.Printf("%s: %v\n", what, err)
		}
	}
	say("first", fencedWrite(ctx, db, table, name, token, "holder, before"))
	// Paused here by the test until its successor has written.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	say("late", fencedWrite(ctx, db, table, name, token, "holder, late"))
	return nil
}
