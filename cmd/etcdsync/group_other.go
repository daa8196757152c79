//go:build unix && !linux

package main

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// emptyPoll is how often the group is checked for processes left after the command exited:
// without Linux's child subreaper, the orphans of the group are init's, and only a signal 0
// to the group tells whether any is left.
const emptyPoll = 20 * time.Millisecond

// startGroup starts cmd as the leader of a new process group and follows the group until it
// is gone (see the Linux version).
func startGroup(cmd *exec.Cmd) (*group, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &group{pid: cmd.Process.Pid, exited: make(chan struct{}), empty: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		g.status = cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !g.alive() {
			close(g.empty)
			close(g.exited)
			return
		}
		close(g.exited)
		tick := time.NewTicker(emptyPoll)
		defer tick.Stop()
		for range tick.C {
			if !g.alive() {
				close(g.empty)
				return
			}
		}
	}()
	return g, nil
}

// alive reports whether a process of the group is left (zombies count: init reaps them).
func (g *group) alive() bool {
	return !errors.Is(syscall.Kill(-g.pid, 0), syscall.ESRCH)
}
