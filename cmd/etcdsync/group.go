//go:build unix

package main

import "syscall"

// group is the command's process group: the command started as its leader, and every
// process it started that did not leave the group. etcdsync signals the group as a whole, so
// that `sh -c` and whatever a script starts in the background stop with the command.
type group struct {
	pid    int                // the command's pid, and so the group's id
	exited chan struct{}      // closed once the command has exited; status says how
	status syscall.WaitStatus // written before exited closes
	empty  chan struct{}      // closed once no process of the group is left; after exited
}

// signal sends sig to every process of the group. A group that is gone already (ESRCH) is no
// error, nor a process that changed its user (EPERM: a setuid program); the others get it.
func (g *group) signal(sig syscall.Signal) { _ = syscall.Kill(-g.pid, sig) }
