package fencetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The database servers are processes of Debian's binaries, as etcdtest runs etcd's: on a free
// loopback port, their data in a temporary directory, stopped and removed by stop, and killed
// by the kernel should this process die first (Pdeathsig). Without ETCDSYNC_SQL_FSYNC they
// run without fsync, as etcd's test members do: the tests are about locks, not disks.

// startTimeout bounds how long a server may take to answer once started.
const startTimeout = 60 * time.Second

// durable reports whether the servers sync their commits to disk (ETCDSYNC_SQL_FSYNC set),
// for benchmarks that should count it.
func durable() bool { return os.Getenv("ETCDSYNC_SQL_FSYNC") != "" }

// errNoBinary marks a server that cannot be started because its binaries are not installed.
var errNoBinary = errors.New("not installed")

// process is a server process this package started.
type process struct {
	name   string // for messages: "postgres", "mariadb"
	dir    string // its data and log, removed by stop
	log    string
	cmd    *exec.Cmd
	exited chan struct{} // closed once it has exited and been waited for
}

// startProcess starts cmd (its output to p.log) as uid/gid unless they are -1.
func startProcess(p *process, uid, gid int, cmd *exec.Cmd) error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = asUser(uid, gid)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return nil
}

// asUser runs a child as uid/gid (unless -1), and has the kernel kill it if this process
// dies first, so that a crashed test leaves no server behind.
func asUser(uid, gid int) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if uid >= 0 {
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return attr
}

// stop sends sig, waits for the process to exit (SIGKILL after 30 s), and removes its
// directory.
func (p *process) stop(sig syscall.Signal) {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	_ = os.RemoveAll(p.dir)
}

// serverDir makes a new temporary directory for a server's data and log, named after this
// process, and first removes those of earlier test processes that died before they could
// (their servers went with them: Pdeathsig).
func serverDir(server string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), "fencetest-"+server+"-*-*"))
	for _, dir := range old {
		pid, err := strconv.Atoi(strings.Split(filepath.Base(dir), "-")[2])
		if err == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.RemoveAll(dir)
		}
	}
	return os.MkdirTemp("", fmt.Sprintf("fencetest-%s-%d-", server, os.Getpid()))
}

// discard removes the directory of a server that did not start.
func (p *process) discard() { _ = os.RemoveAll(p.dir) }

// failed returns err with the tail of the server's log.
func (p *process) failed(err error) error {
	out, _ := os.ReadFile(p.log)
	if len(out) > 2000 {
		out = out[len(out)-2000:]
	}
	return fmt.Errorf("%s: %w; the end of %s:\n%s", p.name, err, p.log, out)
}

// awaitServing returns once db answers a ping, or with an error once the process has exited
// or startTimeout has passed. A server gives no event for "ready" that a client could wait
// on, so this asks every 50 ms, as etcdtest does with a member's /health.
func (p *process) awaitServing(db *sql.DB) error {
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return p.failed(fmt.Errorf("not serving after %v: %w", startTimeout, err))
		}
		select {
		case <-p.exited:
			return p.failed(fmt.Errorf("it exited (%v)", p.cmd.ProcessState))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePort returns a loopback port that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// postgresBinDir is the directory of PostgreSQL's initdb and postgres: $ETCDSYNC_POSTGRES_BIN,
// else Debian's newest /usr/lib/postgresql/<version>/bin, else the directory of postgres on
// PATH.
func postgresBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	if dir := os.Getenv("ETCDSYNC_POSTGRES_BIN"); dir != "" {
		dirs = []string{dir}
	} else if bin, err := exec.LookPath("postgres"); err == nil {
		dirs = append(dirs, filepath.Dir(bin))
	}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("postgres: %w: no /usr/lib/postgresql/*/bin/postgres, none on PATH, no $ETCDSYNC_POSTGRES_BIN (Debian: apt-get install postgresql)", errNoBinary)
}

// pgMajor is the major version in a path /usr/lib/postgresql/<major>/bin; 0 if none.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// serverUser returns the uid and gid to run a server that refuses root as: -1, -1 when this
// process is not root; else those of the user named, or of nobody.
func serverUser(name string) (uid, gid int, err error) {
	if os.Geteuid() != 0 {
		return -1, -1, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return 0, 0, fmt.Errorf("no user %s or nobody to run the server as: %w", name, err)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// startPostgres initialises a cluster in a new temporary directory and starts a PostgreSQL
// server on it, on 127.0.0.1 only (no Unix socket), trusting every local connection. As
// root, it runs as the user postgres (PostgreSQL refuses root). dsn is of its database
// "postgres" as user postgres.
func startPostgres() (p *process, dsn string, err error) {
	bin, err := postgresBinDir()
	if err != nil {
		return nil, "", err
	}
	uid, gid, err := serverUser("postgres")
	if err != nil {
		return nil, "", err
	}
	dir, err := serverDir("postgres")
	if err != nil {
		return nil, "", err
	}
	p = &process{name: "postgres", dir: dir, log: filepath.Join(dir, "postgres.log")}
	if uid >= 0 {
		if err := os.Chown(dir, uid, gid); err != nil {
			p.discard()
			return nil, "", err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = asUser(uid, gid)
	if out, err := initdb.CombinedOutput(); err != nil {
		p.discard()
		return nil, "", fmt.Errorf("postgres: initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		p.discard()
		return nil, "", err
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=", "-c", "max_connections=200", "-c", "shared_buffers=32MB"}
	if !durable() {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	if err := startProcess(p, uid, gid, exec.Command(filepath.Join(bin, "postgres"), args...)); err != nil {
		p.discard()
		return nil, "", err
	}
	dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return p, dsn, nil
}

// mariadbBinaries returns MariaDB's server and its install-db script: $ETCDSYNC_MARIADB_BIN
// (a directory holding both), else mariadbd on PATH or in /usr/sbin, and mariadb-install-db
// on PATH or in /usr/bin.
func mariadbBinaries() (server, installDB string, err error) {
	find := func(name string, dirs ...string) string {
		if env := os.Getenv("ETCDSYNC_MARIADB_BIN"); env != "" {
			dirs = []string{env}
		} else if bin, err := exec.LookPath(name); err == nil {
			return bin
		}
		for _, dir := range dirs {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				return filepath.Join(dir, name)
			}
		}
		return ""
	}
	server, installDB = find("mariadbd", "/usr/sbin"), find("mariadb-install-db", "/usr/bin")
	if server == "" || installDB == "" {
		return "", "", fmt.Errorf("mariadb: %w: no mariadbd and mariadb-install-db on PATH, in /usr/sbin and /usr/bin or in $ETCDSYNC_MARIADB_BIN (Debian: apt-get install mariadb-server)", errNoBinary)
	}
	return server, installDB, nil
}

// startMariaDB initialises a data directory in a new temporary directory and starts a MariaDB
// server on it, on 127.0.0.1 (its socket in that directory), as root when this process is
// root (--user=root). dsn is of its database "mysql" as root, who has no password.
func startMariaDB() (p *process, dsn string, err error) {
	server, installDB, err := mariadbBinaries()
	if err != nil {
		return nil, "", err
	}
	dir, err := serverDir("mariadb")
	if err != nil {
		return nil, "", err
	}
	p = &process{name: "mariadb", dir: dir, log: filepath.Join(dir, "mariadb.log")}
	data := filepath.Join(dir, "data")
	userArgs := []string{}
	if os.Geteuid() == 0 {
		userArgs = []string{"--user=root"}
	}
	install := exec.Command(installDB, append([]string{"--no-defaults", "--datadir=" + data,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"}, userArgs...)...)
	install.SysProcAttr = asUser(-1, -1)
	if out, err := install.CombinedOutput(); err != nil {
		p.discard()
		return nil, "", fmt.Errorf("mariadb: mariadb-install-db: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		p.discard()
		return nil, "", err
	}
	flush := "0" // written to the OS about once a second, never synced at commit
	if durable() {
		flush = "1"
	}
	args := append([]string{"--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
		"--log-error=" + p.log, "--skip-name-resolve", "--skip-log-bin", "--performance-schema=OFF",
		"--character-set-server=utf8mb4", "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
		"--innodb-flush-log-at-trx-commit=" + flush, "--innodb-lock-wait-timeout=20", "--max-connections=200"},
		userArgs...)
	if err := startProcess(p, -1, -1, exec.Command(server, args...)); err != nil {
		p.discard()
		return nil, "", err
	}
	dsn = fmt.Sprintf("root@tcp(127.0.0.1:%d)/mysql", port)
	return p, dsn, nil
}

// serverVersion returns what the database says its version is.
func serverVersion(ctx context.Context, db *sql.DB, query string) string {
	var v string
	if err := db.QueryRowContext(ctx, query).Scan(&v); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(v)
}
