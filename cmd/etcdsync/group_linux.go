package main

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
)

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

// startGroup starts cmd as the leader of a new process group and follows the group until it
// is gone.
//
// etcdsync makes itself a child subreaper, so that the processes of the group that outlive
// their parent (a script's background jobs) become its children rather than init's: it can
// then wait for every one of them, and knows exactly when the group is gone, with no polling
// and no zombie left (many container inits never reap them). cmd's direct child also gets
// SIGKILL if etcdsync itself dies (Pdeathsig): the signal comes when the thread that started
// it ends, so that thread stays locked to the goroutine that waits for the group.
func startGroup(cmd *exec.Cmd) (*group, error) {
	// Best effort: without it (Linux before 3.4), orphans go to init and are not waited for.
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	g := &group{exited: make(chan struct{}), empty: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		g.pid = cmd.Process.Pid
		started <- nil
		g.reap()
		_ = cmd.Process.Release() // reaped here, not by cmd.Wait
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return g, nil
}

// reap waits for the processes of the group, the command and its orphans alike, until none is
// left. When the command exits it first reaps what has exited too, so that empty is closed
// before exited if nothing else is left.
func (g *group) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := wait4(-g.pid, &ws, 0)
		if err != nil { // ECHILD: no process of the group is left
			close(g.empty)
			return
		}
		if pid != g.pid {
			continue // an orphan of the group, reaped
		}
		g.status = ws
		for {
			pid, err := wait4(-g.pid, &ws, syscall.WNOHANG)
			if err != nil {
				close(g.empty)
				close(g.exited)
				return
			}
			if pid == 0 {
				break // processes of the group live on
			}
		}
		close(g.exited)
	}
}

// wait4 is syscall.Wait4 on pid, retried when a signal interrupts it.
func wait4(pid int, ws *syscall.WaitStatus, options int) (int, error) {
	for {
		wpid, err := syscall.Wait4(pid, ws, options, nil)
		if !errors.Is(err, syscall.EINTR) {
			return wpid, err
		}
	}
}
