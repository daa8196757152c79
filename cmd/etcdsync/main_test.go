package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// harness runs the etcdsync binary, built once for the test that owns it, against the
// test cluster.
type harness struct {
	bin string
}

// newHarness builds the binary into t's temporary directory, with the race detector if
// the tests run with it, so that its races are found too.
func newHarness(t *testing.T) *harness {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build etcdsync: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "etcdsync")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goTool, append(args, ".")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return &harness{bin: bin}
}

// environ is the binary's environment: this process's, without ETCDCTL_* and ETCDSYNC_*,
// with ETCDCTL_ENDPOINTS naming the test cluster (so that the variable is tested too), and
// extra.
func environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCDCTL_") && !strings.HasPrefix(kv, "ETCDSYNC_") {
			env = append(env, kv)
		}
	}
	env = append(env, "ETCDCTL_ENDPOINTS="+strings.Join(cluster.Endpoints(), ","))
	return append(env, extra...)
}

// process is one run of the binary.
type process struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout *lines
	stderr *lines
	exited chan struct{}
	code   int // once exited
}

// start runs the binary with args and env (see environ) until it exits; the test's cleanup
// stops it if it is still running then.
func (h *harness) start(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	p := &process{t: t, cmd: cmd, exited: make(chan struct{})}
	var err error
	var stdoutW, stderrW *os.File
	if p.stdout, stdoutW, err = newLines(); err != nil {
		t.Fatal(err)
	}
	if p.stderr, stderrW, err = newLines(); err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	err = cmd.Start()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
		close(p.exited)
	}()
	t.Cleanup(p.stop)
	return p
}

// run runs the binary to its end (at most a minute) and returns its exit status.
func (h *harness) run(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := h.start(t, env, args...)
	p.wait(time.Minute)
	return p
}

// wait returns the exit status once the process exited, or fails the test after d.
func (p *process) wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		p.t.Fatalf("%v did not exit within %v; stderr:\n%s", p.cmd.Args[1:], d, p.stderr.text())
	}
	p.stdout.drained(p.t)
	p.stderr.drained(p.t)
	if strings.Contains(p.stderr.text(), "DATA RACE") {
		p.t.Errorf("%v: the race detector found a race:\n%s", p.cmd.Args[1:], p.stderr.text())
	}
	return p.code
}

// signal sends sig to the etcdsync process.
func (p *process) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// stop ends a process the test left running: SIGTERM, which it passes on to its command,
// then SIGKILL.
func (p *process) stop() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	p.stdout.close()
	p.stderr.close()
}

// lines collects what a process writes to a pipe, line by line, as it comes.
type lines struct {
	r    *os.File
	ch   chan string // every line, in order; closed at EOF
	done chan struct{}

	mu  sync.Mutex
	all []string
}

func newLines() (*lines, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	l := &lines{r: r, ch: make(chan string, 10000), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer close(l.ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l.mu.Lock()
			l.all = append(l.all, sc.Text())
			l.mu.Unlock()
			l.ch <- sc.Text()
		}
	}()
	return l, w, nil
}

// next returns the next line, or fails the test if none comes within d.
func (l *lines) next(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case s, ok := <-l.ch:
		if !ok {
			t.Fatalf("no line within %v: the pipe closed", d)
		}
		return s
	case <-time.After(d):
		t.Fatalf("no line within %v", d)
	}
	return ""
}

// awaitLine returns the first line from now on that contains want, or fails the test after d.
func (l *lines) awaitLine(t *testing.T, want string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if s := l.next(t, time.Until(deadline)); strings.Contains(s, want) {
			return s
		}
	}
}

// drained waits for the pipe's end, which comes when every process holding it is gone.
func (l *lines) drained(t *testing.T) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Errorf("a process still holds the output pipe 10s after etcdsync exited")
	}
}

func (l *lines) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return ""
	}
	return strings.Join(l.all, "\n") + "\n"
}

func (l *lines) close() {
	l.r.Close()
	<-l.done
}

// events is a FIFO that child scripts write lines to ("echo start >"$EV"), read as they come.
type events struct {
	path  string
	f     *os.File
	lines chan string
	done  chan struct{}
}

// newEvents makes the FIFO. It stays open for writing too, so that writers never block and
// readers never see its end.
func newEvents(t *testing.T) *events {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := &events{path: path, f: f, lines: make(chan string, 1000), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			e.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		f.Close()
		<-e.done
	})
	return e
}

// next returns the next event, or fails the test after d.
func (e *events) next(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case s := <-e.lines:
		return s
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
	}
	return ""
}

// none fails the test if an event is there now.
func (e *events) none(t *testing.T, what string) {
	t.Helper()
	select {
	case s := <-e.lines:
		t.Fatalf("%s: unexpected event %q", what, s)
	default:
	}
}

// gates are FIFOs that child scripts wait on (`read _ <"$D/go.$ID"`) until the test opens
// them. The test keeps each open for writing, so that what it writes before a child reads
// waits in the pipe for it.
type gates struct {
	dir string
	mu  sync.Mutex
	fs  map[string]*os.File
}

func newGates(t *testing.T) *gates {
	g := &gates{dir: t.TempDir(), fs: map[string]*os.File{}}
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, f := range g.fs {
			f.Close()
		}
	})
	return g
}

// make creates the gate of id.
func (g *gates) make(t *testing.T, id string) {
	t.Helper()
	path := filepath.Join(g.dir, "go."+id)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.fs[id] = f
	g.mu.Unlock()
}

// open lets the child waiting at gate id go on.
func (g *gates) open(t *testing.T, id string) {
	t.Helper()
	g.mu.Lock()
	f := g.fs[id]
	g.mu.Unlock()
	if _, err := io.WriteString(f, "go\n"); err != nil {
		t.Fatalf("open gate %s: %v", id, err)
	}
}

// testContext is a context for a test's own etcd calls.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// keysOf returns the keys of name (under prefix) in etcd, by create revision.
func keysOf(t *testing.T, cli *clientv3.Client, prefix, name string) []*keyInfo {
	t.Helper()
	resp, err := cli.Get(testContext(t), prefix+core.NamePrefix(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var out []*keyInfo
	for _, kv := range resp.Kvs {
		out = append(out, &keyInfo{key: string(kv.Key), rev: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease), value: string(kv.Value)})
	}
	return out
}

type keyInfo struct {
	key   string
	rev   int64
	lease clientv3.LeaseID
	value string
}

// nothingLeft fails the test if a key of name (under prefix) is left in etcd, but a
// semaphore's limit record, which is meant to stay; it deletes that.
func nothingLeft(t *testing.T, cli *clientv3.Client, prefix, name string) {
	t.Helper()
	for _, k := range keysOf(t, cli, prefix, name) {
		if k.key == prefix+core.NamePrefix(name)+core.RecordLimit {
			if _, err := cli.Delete(testContext(t), k.key); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("key %s left in etcd (lease %x)", k.key, int64(k.lease))
	}
}

// assertOneLine fails the test unless s is exactly one line that starts with prefix.
func assertOneLine(t *testing.T, s, prefix string) {
	t.Helper()
	if strings.Count(s, "\n") != 1 || !strings.HasPrefix(s, prefix) {
		t.Errorf("want one line starting with %q, got:\n%s", prefix, s)
	}
}

// script returns a command line running the shell script body: sh -c body.
func script(body string) []string { return []string{"--", "/bin/sh", "-c", body} }

// alive reports whether pid is a live process: not gone, not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
