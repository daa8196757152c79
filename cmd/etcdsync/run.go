package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// killWait is how long etcdsync waits for a process group to be gone after SIGKILL before it
// gives up on it: a killed process ends at once unless the kernel holds it (a hung disk).
const killWait = 5 * time.Second

// holdCommand is lock, rlock, sem or elect, parsed.
type holdCommand struct {
	verb    string   // lock, rlock, sem, elect
	name    string   // the name to hold
	command []string // what to run; nil to hold until interrupted

	conn    connection
	ttl     time.Duration
	prefix  string
	timeout time.Duration
	grace   time.Duration
	try     bool
	shell   bool
	verbose bool
	limit   int    // sem -n
	value   string // elect --value
}

// what names the thing held, for messages: `lock "nightly"`.
func (c *holdCommand) what() string {
	noun := map[string]string{"lock": "lock", "rlock": "read lock", "sem": "semaphore", "elect": "election"}[c.verb]
	return fmt.Sprintf("%s %q", noun, c.name)
}

// keyPrefix is where the name's keys live.
func (c *holdCommand) keyPrefix() string { return c.prefix + core.NamePrefix(c.name) }

// acquirer makes the primitive; its constructor validates the name and options, with no I/O.
func (c *holdCommand) acquirer(cli *clientv3.Client) (acquirer, error) {
	// The options of every package are interchangeable.
	opts := []mutex.Option{mutex.WithTTL(c.ttl)}
	if c.prefix != "" {
		opts = append(opts, mutex.WithPrefix(c.prefix))
	}
	var a acquirer
	var err error
	switch c.verb {
	case "lock":
		var m *mutex.Mutex
		m, err = mutex.New(cli, c.name, opts...)
		a = lock{m}
	case "rlock":
		var rw *rwmutex.RWMutex
		rw, err = rwmutex.New(cli, c.name, opts...)
		a = readLock{rw: rw, cli: cli, timeout: c.conn.commandTimeout}
	case "sem":
		var s *semaphore.Semaphore
		s, err = semaphore.New(cli, c.name, c.limit, opts...)
		a = permits{s}
	case "elect":
		var e *election.Election
		e, err = election.New(cli, c.name, opts...)
		a = candidate{e: e, value: c.value}
	}
	if err != nil {
		return nil, usagef("%v", err)
	}
	return a, nil
}

// run acquires, runs the command (or waits for a signal), releases, and returns the exit
// status: the command's, or one of etcdsync's own with the error that says why.
func (c *holdCommand) run(a *app) (int, error) {
	// From here on a signal is ours to handle: it cancels the wait, or goes to the command.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)

	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	defer c.shutdown(a, cli)
	acq, err := c.acquirer(cli)
	if err != nil {
		return 0, err
	}
	if err := c.conn.probe(cli, c.keyPrefix()); err != nil {
		return 0, err
	}
	h, err := c.acquire(a, acq, sigc)
	if err != nil {
		return 0, err
	}
	var code int
	if c.command == nil {
		code, err = c.holdUntilSignalled(a, h, sigc)
	} else {
		code, err = c.runCommand(a, h, sigc)
	}
	if rerr := c.release(a, h); rerr != nil && err == nil {
		a.warnf("%v", rerr)
	}
	return code, err
}

// acquire waits for the hold (or tries once) until --timeout or a signal. A wait cut short
// leaves no key: the primitives delete their key before they return.
func (c *holdCommand) acquire(a *app, acq acquirer, sigc <-chan os.Signal) (hold, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	type result struct {
		h   hold
		err error
	}
	resc := make(chan result, 1)
	start := time.Now()
	a.logf("%s: waiting (ttl %v)", c.what(), c.ttl)
	go func() {
		var r result
		if c.try {
			r.h, r.err = acq.try(ctx)
		} else {
			r.h, r.err = acq.acquire(ctx)
		}
		resc <- r
	}()
	var r result
	select {
	case r = <-resc:
	case sig := <-sigc:
		cancel()
		if r = <-resc; r.err == nil {
			_ = c.release(a, r.h)
		}
		return nil, failf(exitSignal+signum(sig), "%s while waiting for %s", signame(sig), c.what())
	}
	switch err := r.err; {
	case err == nil:
	case errors.Is(err, errBusy):
		return nil, failf(exitBusy, "%s is busy", c.what())
	case c.timeout > 0 && errors.Is(err, context.DeadlineExceeded):
		return nil, failf(exitTimeout, "%s not acquired within %v", c.what(), c.timeout)
	case errors.Is(err, semaphore.ErrLimitMismatch):
		return nil, usagef("-n %d: %v", c.limit, err)
	default:
		return nil, fail(exitEtcd, err)
	}
	h := r.h
	h.Done() // watch the hold from now on, so that a loss is known at once
	a.logf("%s: acquired after %v: key %s, token %d", c.what(), time.Since(start).Round(time.Millisecond), h.Key(), h.Token())
	return h, nil
}

// holdUntilSignalled prints the key and the token and holds until a signal (exit 0) or a loss.
func (c *holdCommand) holdUntilSignalled(a *app, h hold, sigc <-chan os.Signal) (int, error) {
	fmt.Fprintf(a.stdout, "ETCDSYNC_NAME=%s\nETCDSYNC_KEY=%s\nETCDSYNC_TOKEN=%d\n", shellQuote(c.name), shellQuote(h.Key()), h.Token())
	select {
	case <-h.Done():
		return 0, failf(exitLost, "%s lost: %v", c.what(), h.Err())
	case sig := <-sigc:
		a.logf("%s: releasing on %s", c.what(), signame(sig))
		return exitOK, nil
	}
}

// runCommand starts the command in a process group of its own, supervises it until the
// group is gone, and returns its exit status, or exitLost if the hold was lost meanwhile.
func (c *holdCommand) runCommand(a *app, h hold, sigc <-chan os.Signal) (int, error) {
	argv := c.command
	if c.shell {
		argv = []string{"/bin/sh", "-c", strings.Join(c.command, " ")}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"ETCDSYNC_NAME="+c.name,
		"ETCDSYNC_KEY="+h.Key(),
		"ETCDSYNC_TOKEN="+strconv.FormatInt(h.Token(), 10),
	)
	select {
	case <-h.Done():
		return 0, failf(exitLost, "%s lost before the command started: %v", c.what(), h.Err())
	default:
	}
	a.logf("%s: starting %q", c.what(), argv)
	g, err := startGroup(cmd)
	if err != nil {
		return 0, startError(argv[0], err)
	}
	a.logf("%s: command started: pid and process group %d", c.what(), g.pid)
	lost := c.supervise(a, h, g, sigc)
	if lost {
		return 0, failf(exitLost, "%s lost while the command ran (%v): the command was stopped", c.what(), h.Err())
	}
	return exitStatus(g.status), nil
}

// supervise passes signals on to the command's group until the group is gone, and stops
// the group, all of it at once, when the hold is lost or the command exits leaving
// processes behind: SIGTERM (and SIGCONT, for stopped ones), SIGKILL after --grace. It
// reports whether the hold was lost while the group lived.
func (c *holdCommand) supervise(a *app, h hold, g *group, sigc <-chan os.Signal) (lost bool) {
	done, exited := h.Done(), g.exited
	var kill, giveUp *time.Timer
	defer func() {
		for _, t := range []*time.Timer{kill, giveUp} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	stop := func() {
		if kill != nil {
			return // stopping already
		}
		g.signal(syscall.SIGTERM)
		g.signal(syscall.SIGCONT)
		a.logf("%s: sent SIGTERM to process group %d; SIGKILL in %v", c.what(), g.pid, c.grace)
		kill = time.NewTimer(c.grace)
	}
	for {
		select {
		case <-done:
			done = nil
			lost = true
			a.logf("%s: lost: %v", c.what(), h.Err())
			stop()
		case sig := <-sigc:
			g.signal(syscall.Signal(signum(sig)))
			a.logf("%s: passed %s on to process group %d", c.what(), signame(sig), g.pid)
		case <-exited:
			exited = nil
			a.logf("%s: command exited: %s", c.what(), describeStatus(g.status))
			select {
			case <-g.empty:
				return lost
			default:
				a.logf("%s: the command left processes in its group", c.what())
				stop()
			}
		case <-timerC(kill):
			g.signal(syscall.SIGKILL)
			a.logf("%s: sent SIGKILL to process group %d", c.what(), g.pid)
			giveUp = time.NewTimer(killWait)
		case <-timerC(giveUp):
			a.warnf("processes of group %d still there %v after SIGKILL; leaving them", g.pid, killWait)
			return lost
		case <-g.empty:
			if exited != nil { // the command's exit and the group's end came at once
				a.logf("%s: command exited: %s", c.what(), describeStatus(g.status))
			}
			a.logf("%s: process group %d is gone", c.what(), g.pid)
			return lost
		}
	}
}

// timerC is t's channel, or nil (never ready) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// release ends the hold within --command-timeout. It returns why it failed, if it did; a
// loss reported here was reported before, or came after the command ended.
func (c *holdCommand) release(a *app, h hold) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	err := h.release(ctx)
	switch {
	case err == nil:
		a.logf("%s: released", c.what())
		return nil
	case errors.Is(err, mutex.ErrLost):
		return fmt.Errorf("%s was lost as it was released: %w", c.what(), err)
	default:
		return fmt.Errorf("%s not released (its key goes when its lease expires, within %v): %w", c.what(), c.ttl, err)
	}
}

// shutdown revokes the client's lease, within --command-timeout, so that nothing of this
// process stays in etcd: no key, also of a wait that failed, and no lease.
func (c *holdCommand) shutdown(a *app, cli *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	if err := mutex.Shutdown(ctx, cli); err != nil {
		a.logf("%s: lease not revoked (it expires in %v): %v", c.what(), c.ttl, err)
	}
}

// startError is why the command could not start, with the status env(1) and sh give.
func startError(name string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, exec.ErrDot), errors.Is(err, fs.ErrNotExist):
		return failf(exitNotFound, "%s: command not found", name)
	default:
		if inner := errors.Unwrap(err); inner != nil {
			err = inner // the errno, without "fork/exec" and the path again
		}
		return failf(exitCannotRun, "cannot run %s: %v", name, err)
	}
}

// exitStatus is the shell's status of a process that ended as ws says: its exit status, or
// 128+N for death by signal N.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	return ws.ExitStatus()
}

func describeStatus(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return fmt.Sprintf("died of %s", signame(ws.Signal()))
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

func signum(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// signame is the signal's C name: SIGTERM rather than "terminated".
func signame(sig os.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
		syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM", syscall.SIGPIPE: "SIGPIPE",
		syscall.SIGSEGV: "SIGSEGV", syscall.SIGABRT: "SIGABRT", syscall.SIGUSR1: "SIGUSR1",
		syscall.SIGUSR2: "SIGUSR2", syscall.SIGALRM: "SIGALRM",
	}
	if s, ok := sig.(syscall.Signal); ok {
		if n, ok := names[s]; ok {
			return n
		}
		return fmt.Sprintf("signal %d", int(s))
	}
	return sig.String()
}

// shellQuote quotes s for a POSIX shell, unless it needs no quotes.
func shellQuote(s string) string {
	safe := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:%@+=,", r))
	}) < 0
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
