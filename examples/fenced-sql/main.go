// Command fenced-sql shows a paused holder's late write refused by the database. Holder A, a
// process of its own, takes a mutex and writes a report row in a transaction fenced by its
// token (package fence); then it is paused with SIGSTOP until its lease expires. Holder B is
// served the lock and writes the report. A is continued with SIGCONT and, not knowing it lost
// the lock, writes at once: the fence refuses its transaction, and the report stays B's. The
// two holders are printed side by side.
//
// It writes to SQLite in a temporary directory, or to the PostgreSQL database that -dsn names.
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/fenced-sql
//	go run ./examples/fenced-sql -dsn postgres://user@localhost/db -endpoints 127.0.0.1:2379
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the driver "pgx"
	_ "modernc.org/sqlite"             // the driver "sqlite"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/fence"
	"github.com/etcdsync/etcdsync/mutex"
)

// holderVariable, set, makes this program holder A: the parent passes what A needs in
// FENCED_SQL_* variables.
const holderVariable = "FENCED_SQL_HOLDER"

func main() {
	if os.Getenv(holderVariable) != "" {
		if err := holder(); err != nil {
			fmt.Fprintln(os.Stderr, "fenced-sql: holder A:", err)
			os.Exit(1)
		}
		return
	}
	endpoints := demo.EndpointsFlag()
	dsn := flag.String("dsn", "", "a PostgreSQL database (default: SQLite in a temporary directory)")
	flag.Parse()
	if err := run(*endpoints, *dsn); err != nil {
		fmt.Fprintln(os.Stderr, "fenced-sql:", err)
		os.Exit(1)
	}
}

// store is where the report lands.
type store struct {
	driver, dsn string
	dialect     fence.Dialect
}

func openStore(s store) (*sql.DB, *fence.Table, error) {
	db, err := sql.Open(s.driver, s.dsn)
	if err != nil {
		return nil, nil, err
	}
	table, err := fence.NewTable(s.dialect, "")
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, table, nil
}

func run(endpoints, dsn string) error {
	s := store{"pgx", dsn, fence.Postgres}
	if dsn == "" {
		dir, err := os.MkdirTemp("", "fenced-sql-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		s = store{"sqlite", "file:" + filepath.Join(dir, "report.db") + "?_pragma=busy_timeout(10000)", fence.SQLite}
		fmt.Println("SQLite at", filepath.Join(dir, "report.db"))
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	db, table, err := openStore(s)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := table.Create(ctx, db); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS fenced_sql_report (resource TEXT PRIMARY KEY, body TEXT, token BIGINT)`); err != nil {
		return err
	}
	// A resource of this run's own: a fence row keeps tokens of one etcd cluster, and the
	// embedded etcd of another run counts from 1 again.
	resource := "fenced-sql/" + rand.Text()[:8]

	joinEndpoints, prefix := etcd.Join()
	a := exec.CommandContext(ctx, os.Args[0])
	a.Env = append(os.Environ(), holderVariable+"=1", "FENCED_SQL_ETCD="+joinEndpoints, "FENCED_SQL_PREFIX="+prefix,
		"FENCED_SQL_DRIVER="+s.driver, "FENCED_SQL_DSN="+s.dsn, "FENCED_SQL_DIALECT="+strconv.Itoa(int(s.dialect)),
		"FENCED_SQL_RESOURCE="+resource)
	a.Stderr = os.Stderr
	aIn, err := a.StdinPipe()
	if err != nil {
		return err
	}
	aOut, err := a.StdoutPipe()
	if err != nil {
		return err
	}
	if err := a.Start(); err != nil {
		return err
	}
	defer func() {
		if a.ProcessState == nil { // an early return: end A, stopped or not
			_ = a.Process.Signal(syscall.SIGCONT)
			_ = a.Process.Kill()
			_ = a.Wait()
		}
	}()
	lines := bufio.NewScanner(aOut)
	left := func() string { // A's next line
		if !lines.Scan() {
			return "(holder A ended)"
		}
		return lines.Text()
	}
	row := func(a, b string) { fmt.Printf("%-44s %s\n", a, b) }

	row(fmt.Sprintf("holder A (process %d)", a.Process.Pid), "holder B")
	row(left(), "") // locked
	row(left(), "") // wrote
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	row("paused (SIGSTOP)", "")

	cli, err := etcd.Client()
	if err != nil {
		return err
	}
	b, err := mutex.New(cli, resource)
	if err != nil {
		return err
	}
	row("", "waits for the lock")
	if err := b.Lock(ctx); err != nil {
		return err
	}
	defer b.Unlock(context.WithoutCancel(ctx))
	row("", fmt.Sprintf("locked, token %d (A's lease expired)", b.Token()))
	row("", wrote("final", b.Token(), writeReport(ctx, db, table, resource, b.Token(), "final")))

	if _, err := io.WriteString(aIn, "write\n"); err != nil { // A reads it once continued
		return err
	}
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	row("continued (SIGCONT): writes at once", "")
	row(left(), "")
	if err := a.Wait(); err != nil {
		return fmt.Errorf("holder A: %w", err)
	}

	var body string
	var token int64
	if err := db.QueryRowContext(ctx, `SELECT body, token FROM fenced_sql_report WHERE resource = `+param(s.dialect, 1),
		resource).Scan(&body, &token); err != nil {
		return err
	}
	fmt.Printf("the report: %q, by token %d\n", body, token)
	if body != "final" {
		return errors.New("the late write landed")
	}
	return nil
}

// holder is holder A: it takes the lock with a lease of 1 s (so that a pause loses it
// soon), writes "draft", then waits for a line on its standard input (the parent pauses it
// meanwhile) and writes "late" with the same token. It says how each went, a line each.
func holder() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := demo.Connect(os.Getenv("FENCED_SQL_ETCD"), os.Getenv("FENCED_SQL_PREFIX"))
	if err != nil {
		return err
	}
	defer cli.Close()
	dialect, _ := strconv.Atoi(os.Getenv("FENCED_SQL_DIALECT"))
	db, table, err := openStore(store{os.Getenv("FENCED_SQL_DRIVER"), os.Getenv("FENCED_SQL_DSN"), fence.Dialect(dialect)})
	if err != nil {
		return err
	}
	defer db.Close()
	resource := os.Getenv("FENCED_SQL_RESOURCE")
	m, err := mutex.New(cli, resource, mutex.WithTTL(time.Second))
	if err != nil {
		return err
	}
	if err := m.Lock(ctx); err != nil {
		return err
	}
	token := m.Token()
	fmt.Printf("locked, token %d\n", token)
	fmt.Println(wrote("draft", token, writeReport(ctx, db, table, resource, token, "draft")))
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	fmt.Println(wrote("late", token, writeReport(ctx, db, table, resource, token, "late")))
	return nil
}

// writeReport writes the report of resource in one transaction fenced by token.
func writeReport(ctx context.Context, db *sql.DB, table *fence.Table, resource string, token int64, body string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // nothing to roll back after Commit
	if err := table.Check(ctx, tx, resource, token); err != nil {
		return err // fence.ErrStale: a newer holder has written; nothing of tx commits
	}
	d := table.Dialect()
	_, err = tx.ExecContext(ctx, `INSERT INTO fenced_sql_report (resource, body, token) VALUES (`+
		param(d, 1)+`, `+param(d, 2)+`, `+param(d, 3)+`)
		ON CONFLICT (resource) DO UPDATE SET body = excluded.body, token = excluded.token`, resource, body, token)
	if err != nil {
		return err
	}
	return tx.Commit()
}

// wrote says how a write went.
func wrote(body string, token int64, err error) string {
	switch {
	case err == nil:
		return fmt.Sprintf("wrote %q, token %d", body, token)
	case errors.Is(err, fence.ErrStale):
		return fmt.Sprintf("%q refused: token %d is stale", body, token)
	}
	return fmt.Sprintf("%q failed: %v", body, err)
}

// param is the dialect's bind parameter n.
func param(d fence.Dialect, n int) string {
	if d == fence.Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?" + strconv.Itoa(n)
}
