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
// group is gone, and returns its exit status (see commandStatus); exitLost if the hold was
// lost meanwhile; exitMaxHold if maxHeld fired first (--max-hold: the group was stopped);
// 128+N if etcdsync was asked to stop by signal N, whatever the command's own status.
func (c *holdCommand) runCommand(a *app, h hold, sigc <-chan os.Signal, maxHeld <-chan time.Time) (int, error) {
	argv := c.command
	if c.shell {
		argv = []string{"/bin/sh", "-c", strings.Join(c.command, " ")}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = c.environment(h)
	select {
	case <-h.Done():
		return 0, failf(exitLost, "%s lost before the command started: %s", c.what(), lossCause(h.Err()))
	case sig := <-sigc:
		c.stopSignal = sig
		return 0, failf(exitSignal+signum(sig), "%s before the command started", signame(sig))
	default:
	}
	a.logf("%s: starting %q", c.what(), argv)
	g, err := startGroup(cmd)
	if err != nil {
		return 0, startError(argv[0], err)
	}
	a.logf("%s: command started: pid and process group %d", c.what(), g.pid)
	end := c.supervise(a, h, g, sigc, maxHeld)
	switch {
	case c.verb == "elect" && end.asked && !end.lost && !end.maxHeld && c.stopSignal == nil:
		a.logf("%s: the command was stopped to hand the leadership over", c.what())
		c.yielded = true
		return exitOK, nil
	case end.lost:
		return 0, failf(exitLost, "%s lost while the command ran (%s): the command was stopped", c.what(), lossCause(h.Err()))
	case end.maxHeld && c.stopSignal == nil:
		return 0, failf(exitMaxHold, "%s held for --max-hold %v: the command was stopped", c.what(), c.maxHold)
	case c.stopSignal != nil && end.killed != "":
		return 0, failf(exitSignal+signum(c.stopSignal), "%s: the command's process group got SIGKILL: %s", signame(c.stopSignal), end.killed)
	case c.stopSignal != nil:
		return exitSignal + signum(c.stopSignal), nil
	case !end.ended: // it outlived SIGKILL: as good as killed, and reported
		return c.commandStatus(a, exitSignal+int(syscall.SIGKILL)), nil
	}
	return c.commandStatus(a, exitStatus(g.status)), nil
}

// environment is the command's environment: etcdsync's own, ETCDSYNC_NAME, and
// ETCDSYNC_KEY and ETCDSYNC_TOKEN of the hold; for a barrier's participant, which has no
// fencing token (and no key to show), ETCDSYNC_ROUND instead: the round's number. Those it
// does not set, it passes on as it got them (an outer etcdsync lock's, say).
func (c *holdCommand) environment(h hold) []string {
	env := append(os.Environ(), "ETCDSYNC_NAME="+c.nameVar())
	if p, ok := h.(participant); ok {
		return append(env, "ETCDSYNC_ROUND="+strconv.FormatInt(p.Round(), 10))
	}
	env = append(env, "ETCDSYNC_KEY="+h.Key(), "ETCDSYNC_TOKEN="+strconv.FormatInt(h.Token(), 10))
	if !c.period.IsZero() {
		env = append(env, "ETCDSYNC_PERIOD="+c.period.Format(time.RFC3339))
	}
	return env
}

// commandStatus is the status etcdsync exits with for a command that ended with status:
// status itself, or --command-failed's N for any status but 0.
func (c *holdCommand) commandStatus(a *app, status int) int {
	if status == 0 || c.commandFailed == 0 {
		return status
	}
	a.logf("%s: the command's status %d is exit %d (--command-failed)", c.what(), status, c.commandFailed)
	return c.commandFailed
}

// ending is how a supervised command's process group ended.
type ending struct {
	lost    bool   // the hold was lost while the group lived
	maxHeld bool   // --max-hold passed while the group lived: the group was stopped for it
	asked   bool   // the leadership was asked to move (elect), or the hold to let go (--yield-on-ask): the group was stopped for it
	ended   bool   // the group is gone (g.status says how the command ended); not if it outlived SIGKILL by killWait
	killed  string // why the group got SIGKILL, if it did
}

// stopPhase is how far etcdsync has gone in stopping a command's group.
type stopPhase int

const (
	notStopping stopPhase = iota // the group runs undisturbed
	terminating                  // SIGTERM (or the signal passed on) sent: SIGKILL once --grace runs out
	killing                      // SIGKILL sent: given up on after killWait
)

// supervise passes signals on to the command's group until the group is gone, and stops
// the group, all of it at once: SIGTERM (and SIGCONT, for stopped processes), or the first
// signal etcdsync got, then SIGKILL once --grace has run out, or at once on a second signal.
// It stops the group when the hold is lost, when maxHeld fires (--max-hold), when a signal
// asks etcdsync to stop (recorded in c.stopSignal), and when the command exits leaving
// processes behind.
func (c *holdCommand) supervise(a *app, h hold, g *group, sigc <-chan os.Signal, maxHeld <-chan time.Time) ending {
	var end ending
	done, exited, asked := h.Done(), g.exited, c.askedOf(h)
	phase := notStopping
	var kill, giveUp *time.Timer
	defer func() {
		for _, t := range []*time.Timer{kill, giveUp} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	terminate := func(sig syscall.Signal, why string) {
		if phase != notStopping {
			return
		}
		phase = terminating
		g.signal(sig)
		g.signal(syscall.SIGCONT)
		a.logf("%s: %s: sent %s to process group %d; SIGKILL in %v, or at a second signal", c.what(), why, signame(sig), g.pid, c.grace)
		kill = time.NewTimer(c.grace)
	}
	killAll := func(why string) {
		if phase == killing {
			return
		}
		phase = killing
		if kill != nil {
			kill.Stop()
		}
		g.signal(syscall.SIGKILL)
		end.killed = why
		a.logf("%s: %s: sent SIGKILL to process group %d", c.what(), why, g.pid)
		giveUp = time.NewTimer(killWait)
	}
	for {
		select {
		case <-done:
			done = nil
			end.lost = true
			a.logf("%s: lost: %s", c.what(), lossCause(h.Err()))
			terminate(syscall.SIGTERM, "hold lost")
		case <-maxHeld:
			maxHeld = nil
			end.maxHeld = true
			a.logf("%s: --max-hold %v passed", c.what(), c.maxHold)
			terminate(syscall.SIGTERM, "--max-hold passed")
		case <-asked:
			asked = nil
			end.asked = true
			if c.verb != "elect" {
				a.warnf("%s: asked to let go (etcdsync ask): stopping the command", c.what())
				terminate(syscall.SIGTERM, "asked to let go")
				break
			}
			a.logf("%s: asked to hand the leadership over", c.what())
			terminate(syscall.SIGTERM, "leadership asked to move")
		case sig := <-sigc:
			switch {
			case c.stopSignal != nil:
				killAll(fmt.Sprintf("%s after %s", signame(sig), signame(c.stopSignal)))
			case phase == notStopping:
				c.stopSignal = sig
				terminate(syscall.Signal(signum(sig)), "got "+signame(sig))
			default: // stopping already: pass it on, the grace runs on
				c.stopSignal = sig
				g.signal(syscall.Signal(signum(sig)))
				a.logf("%s: passed %s on to process group %d", c.what(), signame(sig), g.pid)
			}
		case <-exited:
			exited = nil
			a.logf("%s: command exited: %s", c.what(), describeStatus(g.status))
			select {
			case <-g.empty:
				end.ended = true
				return end
			default:
				terminate(syscall.SIGTERM, "the command left processes in its group")
			}
		case <-timerC(kill):
			kill = nil
			killAll(fmt.Sprintf("--grace %v ran out", c.grace))
		case <-timerC(giveUp):
			a.warnf("processes of group %d still there %v after SIGKILL; leaving them", g.pid, killWait)
			end.ended = exited == nil
			return end
		case <-g.empty:
			if exited != nil { // the command's exit and the group's end came at once
				a.logf("%s: command exited: %s", c.what(), describeStatus(g.status))
			}
			a.logf("%s: process group %d is gone", c.what(), g.pid)
			end.ended = true
			return end
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
