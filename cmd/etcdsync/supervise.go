//go:build unix

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killWait is how long etcdsync waits for a process group to be gone after SIGKILL before it
// gives up on it: a killed process ends at once unless the kernel holds it (a hung disk).
const killWait = 5 * time.Second

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
	case sig := <-sigc:
		return 0, failf(exitSignal+signum(sig), "%s before the command started", signame(sig))
	default:
	}
	a.logf("%s: starting %q", c.what(), argv)
	g, err := startGroup(cmd)
	if err != nil {
		return 0, startError(argv[0], err)
	}
	a.logf("%s: command started: pid and process group %d", c.what(), g.pid)
	lost, ended := c.supervise(a, h, g, sigc)
	switch {
	case lost:
		return 0, failf(exitLost, "%s lost while the command ran (%v): the command was stopped", c.what(), h.Err())
	case !ended: // it outlived SIGKILL: as good as killed, and reported
		return exitSignal + int(syscall.SIGKILL), nil
	}
	return exitStatus(g.status), nil
}

// supervise passes signals on to the command's group until the group is gone, and stops
// the group, all of it at once, when the hold is lost or the command exits leaving
// processes behind: SIGTERM (and SIGCONT, for stopped ones), SIGKILL after --grace. It
// reports whether the hold was lost while the group lived, and whether the command ended
// (g.status says how); it did unless it outlived SIGKILL by killWait.
func (c *holdCommand) supervise(a *app, h hold, g *group, sigc <-chan os.Signal) (lost, ended bool) {
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
			c.stopAsked = true
			g.signal(syscall.Signal(signum(sig)))
			a.logf("%s: passed %s on to process group %d", c.what(), signame(sig), g.pid)
		case <-exited:
			exited = nil
			a.logf("%s: command exited: %s", c.what(), describeStatus(g.status))
			select {
			case <-g.empty:
				return lost, true
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
			return lost, exited == nil
		case <-g.empty:
			if exited != nil { // the command's exit and the group's end came at once
				a.logf("%s: command exited: %s", c.what(), describeStatus(g.status))
			}
			a.logf("%s: process group %d is gone", c.what(), g.pid)
			return lost, true
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
