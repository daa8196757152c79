package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/fence"
	"github.com/etcdsync/etcdsync/mutex"
)

// A nightly job writes its report under a mutex. Its first holder pauses (a long GC, a
// stopped VM) while its hold is lost and the next holder writes; when it wakes and writes
// with its token, its transaction is refused, and the report stays the next holder's.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: exampleEndpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fence-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "reports.db")) // any database/sql driver
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	table, err := fence.NewTable(fence.SQLite, "") // the table etcdsync_fence
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := table.Create(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE reports (day TEXT PRIMARY KEY, body TEXT)`); err != nil {
		fmt.Println(err)
		return
	}

	first, err := mutex.New(cli, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	next, err := mutex.New(cli, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := first.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	token := first.Token()
	fmt.Println("first holder:", writeReport(ctx, db, table, token, "draft"))
	// The first holder pauses here. Its hold ends without it (Unlock stands in for its
	// lease's expiry), and the next holder takes the lock and writes.
	if err := first.Unlock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if err := next.Lock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("next holder:", writeReport(ctx, db, table, next.Token(), "final"))
	if err := next.Unlock(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// The first holder wakes and writes, with its token.
	err = writeReport(ctx, db, table, token, "draft, revised")
	fmt.Println("first holder, late:", errors.Is(err, fence.ErrStale))

	var body string
	if err := db.QueryRowContext(ctx, `SELECT body FROM reports`).Scan(&body); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("report:", body)
	// Output:
	// first holder: <nil>
	// next holder: <nil>
	// first holder, late: true
	// report: final
}

// writeReport writes the report in one transaction fenced by token: it commits only if no
// higher token has written "nightly-report".
func writeReport(ctx context.Context, db *sql.DB, table *fence.Table, token int64, body string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // nothing to roll back after Commit
	if err := table.Check(ctx, tx, "nightly-report", token); err != nil {
		return err // ErrStale: a newer holder has written; nothing of tx commits
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO reports (day, body) VALUES ('2026-11-29', ?)
		ON CONFLICT (day) DO UPDATE SET body = excluded.body`, body)
	if err != nil {
		return err
	}
	return tx.Commit()
}

// exampleEndpoints are the etcd members the examples run on, from ETCDSYNC_EXAMPLE_ENDPOINTS
// (comma-separated); internal/testkit/exampletest sets it to an etcd it embeds, and links
// the SQLite driver into this package's test binary. Without it there are none, and
// clientv3.New fails at once.
func exampleEndpoints() []string {
	return strings.FieldsFunc(os.Getenv("ETCDSYNC_EXAMPLE_ENDPOINTS"), func(r rune) bool { return r == ',' })
}

// Without ETCDSYNC_EXAMPLE_ENDPOINTS, go test skips the examples, which need an etcd and a
// SQL driver: it compiles them only. An init does it, so that the examples need no TestMain
// of their own.
func init() {
	testing.Init() // registers go test's flags now; its own call later does nothing
	if os.Getenv("ETCDSYNC_EXAMPLE_ENDPOINTS") == "" {
		_ = flag.Set("test.skip", "^Example")
	}
}
