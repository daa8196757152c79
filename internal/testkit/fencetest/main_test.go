// Package fencetest tests package fence on real databases: PostgreSQL and MariaDB server
// processes it starts from the binaries installed (Debian's postgresql and mariadb-server),
// and SQLite in this process (modernc.org/sqlite, pure Go); with holders' tokens from the
// mutex on a real etcd (etcdtest, embedded).
//
// A test that needs a server whose binaries are missing fails, saying so; on a developer's
// machine (CI unset), ETCDSYNC_SKIP_SQL=1 makes it skip instead.
package fencetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the driver "pgx"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/etcdsync/etcdsync/fence"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// cluster is the package's own embedded etcd member (never ETCD_ENDPOINTS': in the short
// tier against such a cluster this package does not run, since nothing here depends on
// etcd's release).
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	if os.Getenv(holderVariable) != "" {
		os.Exit(holderMain()) // a holder process that a story test started: see story_test.go
	}
	etcdtest.MainWith(stoppingServers{m}, &cluster, func() (*etcdtest.Cluster, error) { return etcdtest.NewEmbedded(1) })
}

// stoppingServers runs the tests, then stops the database servers they started, also when
// they failed, before goleak looks for goroutines left running.
type stoppingServers struct{ m *testing.M }

func (s stoppingServers) Run() int {
	defer stopServers()
	return s.m.Run()
}

// backend is a database the tests run on: a server process this package starts on first
// use, or SQLite in this process.
type backend struct {
	name       string // "postgres", "mariadb", "sqlite"
	dialect    fence.Dialect
	driver     string
	isolations []sql.IsolationLevel // the levels the interleavings run at
	versionSQL string
	// start starts the server and returns it, with the DSN of a database of its own; nil
	// for SQLite. dsnOf is the DSN of database name on it.
	start      func() (*process, string, error)
	stopSignal syscall.Signal // the server's fast, clean shutdown
	dsnOf      func(adminDSN, name string) string
	// retryable reports whether err is the database's "roll back and try again": a
	// serialization failure, a deadlock, a busy database.
	retryable func(err error) bool
	// rolledBack reports whether err says the database rolled the transaction back, and
	// so let go of its locks, by itself.
	rolledBack func(err error) bool

	once     sync.Once
	proc     *process
	adminDSN string  // of the server's own database
	admin    *sql.DB // a pool on it, to create the tests' databases
	version  string
	err      error // why the backend cannot be used
	made     atomic.Int64
}

var (
	postgres = &backend{
		name: "postgres", dialect: fence.Postgres, driver: "pgx",
		isolations: []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable},
		versionSQL: "SHOW server_version",
		start:      startPostgres, stopSignal: syscall.SIGINT,
		dsnOf: func(admin, name string) string { return strings.Replace(admin, "/postgres?", "/"+name+"?", 1) },
		retryable: func(err error) bool {
			var pe *pgconn.PgError
			return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
		},
		rolledBack: func(error) bool { return false }, // an aborted transaction keeps its locks until ROLLBACK
	}
	mariadb = &backend{
		name: "mariadb", dialect: fence.MySQL, driver: "mysql",
		isolations: []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable},
		versionSQL: "SELECT VERSION()",
		start:      startMariaDB, stopSignal: syscall.SIGTERM,
		dsnOf: func(admin, name string) string { return strings.TrimSuffix(admin, "/mysql") + "/" + name },
		retryable: func(err error) bool {
			var me *mysql.MySQLError
			return errors.As(err, &me) && me.Number == 1213 // ER_LOCK_DEADLOCK
		},
		rolledBack: func(err error) bool {
			var me *mysql.MySQLError
			return errors.As(err, &me) && me.Number == 1213 // the victim's whole transaction
		},
	}
	sqliteBackend = &backend{
		name: "sqlite", dialect: fence.SQLite, driver: "sqlite",
		isolations: []sql.IsolationLevel{sql.LevelDefault},
		versionSQL: "SELECT sqlite_version()",
		retryable: func(err error) bool {
			var se *sqlite.Error
			return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
		},
		rolledBack: func(error) bool { return false }, // nothing waits on SQLite here
	}
	backends = []*backend{postgres, mariadb, sqliteBackend}
)

// use starts b on first use. A backend that cannot be had fails tb, unless its binaries are
// missing on a developer's machine that asks to skip (ETCDSYNC_SKIP_SQL set, CI unset).
func (b *backend) use(tb testing.TB) {
	tb.Helper()
	b.once.Do(b.begin)
	if b.err == nil {
		return
	}
	if errors.Is(b.err, errNoBinary) && !inCI() && os.Getenv("ETCDSYNC_SKIP_SQL") != "" {
		tb.Skipf("%v: skipped, since ETCDSYNC_SKIP_SQL is set", b.err)
	}
	hint := ""
	if errors.Is(b.err, errNoBinary) && !inCI() {
		hint = " (on a developer's machine without it, ETCDSYNC_SKIP_SQL=1 skips the tests that need it)"
	}
	tb.Fatalf("%v%s", b.err, hint)
}

// inCI reports whether this runs in CI (CI set, as .ci/run's callers set it, to anything but
// "false"), where no server may be missing.
func inCI() bool { ci := os.Getenv("CI"); return ci != "" && ci != "false" }

// begin starts the server, once.
func (b *backend) begin() {
	if b.start == nil {
		b.version = sqliteVersion()
		return
	}
	proc, dsn, err := b.start()
	if err != nil {
		b.err = err
		return
	}
	b.proc, b.adminDSN = proc, dsn
	b.admin, b.err = sql.Open(b.driver, dsn)
	if b.err == nil {
		b.err = proc.awaitServing(b.admin)
	}
	if b.err != nil {
		stopServer(b)
		return
	}
	b.version = serverVersion(context.Background(), b.admin, b.versionSQL)
}

// stopServers stops every server that was started.
func stopServers() {
	for _, b := range backends {
		stopServer(b)
	}
}

func stopServer(b *backend) {
	if b.admin != nil {
		b.admin.Close()
		b.admin = nil
	}
	if b.proc != nil {
		b.proc.stop(b.stopSignal)
		b.proc = nil
	}
}

// database is a database of a test's own on a backend, and a pool on it closed by the
// test's cleanup.
type database struct {
	*sql.DB
	b   *backend
	dsn string
}

// newDatabase makes a new database on b (starting b if need be) for tb. On SQLite it is a
// file in tb's temporary directory, in WAL mode, whose connections wait up to 20 s for a
// lock another holds, and sync nothing unless ETCDSYNC_SQL_FSYNC is set.
func (b *backend) newDatabase(tb testing.TB) *database {
	tb.Helper()
	b.use(tb)
	name := fmt.Sprintf("fence_%d", b.made.Add(1))
	if b.admin != nil {
		if _, err := b.admin.ExecContext(etcdtest.Context(tb), "CREATE DATABASE "+name); err != nil {
			tb.Fatalf("%s: create database %s: %v", b.name, name, err)
		}
		return b.open(tb, b.dsnOf(b.adminDSN, name))
	}
	dsn := "file:" + filepath.Join(tb.TempDir(), name+".db") + "?_pragma=journal_mode(wal)&_pragma=busy_timeout(20000)"
	if !durable() {
		dsn += "&_pragma=synchronous(off)"
	}
	// One connection turns the new file to WAL before a test opens several at once: SQLite
	// answers a change of journal mode that races another connection's open with SQLITE_BUSY
	// at once, without waiting out busy_timeout (TestCreatesAtOnceAllSucceed failed so in CI,
	// 2026-11-29). In a file already in WAL mode, the pragma of a later open does not race.
	db := b.open(tb, dsn)
	if err := db.PingContext(etcdtest.Context(tb)); err != nil {
		tb.Fatalf("%s: open %s: %v", b.name, dsn, err)
	}
	return db
}

// open opens a pool on dsn, closed by tb's cleanup.
func (b *backend) open(tb testing.TB, dsn string) *database {
	tb.Helper()
	db, err := sql.Open(b.driver, dsn)
	if err != nil {
		tb.Fatalf("%s: open %s: %v", b.name, dsn, err)
	}
	tb.Cleanup(func() { db.Close() })
	return &database{DB: db, b: b, dsn: dsn}
}

// sqliteVersion is the version of the SQLite that modernc.org/sqlite embeds.
func sqliteVersion() string {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	defer db.Close()
	return serverVersion(context.Background(), db, "SELECT sqlite_version()")
}

// table returns a fence table of dialect d named name ("" for the default), created in db.
func table(tb testing.TB, db *database, name string) *fence.Table {
	tb.Helper()
	t, err := fence.NewTable(db.b.dialect, name)
	if err != nil {
		tb.Fatal(err)
	}
	if err := t.Create(etcdtest.Context(tb), db.DB); err != nil {
		tb.Fatal(err)
	}
	return t
}
