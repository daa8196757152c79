//go:build unix

package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

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
