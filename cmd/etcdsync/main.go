//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], &app{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
}

// app is where the command writes and what it reads of its environment.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	command        string // "etcdsync lock": the prefix of every message
	verbose        bool   // --verbose: log every step to stderr, with times
}

// logf logs a step of the command with --verbose: a time (UTC, nanoseconds), etcdsync's pid
// and what happened.
func (a *app) logf(format string, args ...any) {
	if a.verbose {
		fmt.Fprintf(a.stderr, "%s %s[%d]: %s\n", time.Now().UTC().Format(time.RFC3339Nano), a.command, os.Getpid(), fmt.Sprintf(format, args...))
	}
}

// warnf reports a problem that does not change the exit status, on one line.
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "%s: warning: %s\n", a.command, message(fmt.Sprintf(format, args...)))
}

// command is a subcommand parsed into its flags, ready to run.
type command interface {
	// define registers the command's flags and returns its subcommand.
	define() *subcommand
	// parse reads the command line (after the subcommand's name) and the environment.
	parse(sub *subcommand, args []string, a *app) error
	// run runs it and returns the exit status, or an error that says which and why.
	run(a *app) (int, error)
}

// newCommand is the command verb, or nil.
func newCommand(verb string) command {
	switch verb {
	case "lock", "rlock", "sem", "elect":
		return &holdCommand{verb: verb}
	case "status":
		return &statusCommand{}
	case "release":
		return &releaseCommand{}
	case "renew":
		return &renewCommand{}
	case "transfer":
		return &transferCommand{}
	case "barrier":
		return &barrierCommand{}
	case "latch":
		return &latchCommand{}
	}
	return nil
}

// run runs the command line args (without the program name) and returns the exit status.
// Every error is one line on stderr.
func run(args []string, a *app) int {
	a.command = "etcdsync"
	lead, verb, args, err := splitLeadingFlags(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printHelp(a.stdout)
		return exitOK
	case err != nil:
		fmt.Fprintf(a.stderr, "etcdsync: %s\n", message(err.Error()))
		return exitCode(err)
	case verb == "":
		fmt.Fprintln(a.stderr, "etcdsync: no command: lock, rlock, sem, elect, transfer, barrier, latch, status, release or renew (etcdsync --help)")
		return exitUsage
	}
	switch verb {
	case "-version", "--version", "version":
		printVersion(a.stdout)
		return exitOK
	case "help":
		if len(args) == 1 {
			if c := newCommand(args[0]); c != nil {
				c.define().printHelp(a.stdout)
				return exitOK
			}
		}
		printHelp(a.stdout)
		return exitOK
	}
	c := newCommand(verb)
	if c == nil {
		fmt.Fprintf(a.stderr, "etcdsync: no command %q: lock, rlock, sem, elect, transfer, barrier, latch, status, release or renew (etcdsync --help)\n", verb)
		return exitUsage
	}
	a.command = "etcdsync " + verb
	sub := c.define()
	err = c.parse(sub, append(lead, args...), a)
	if errors.Is(err, flag.ErrHelp) {
		sub.printHelp(a.stdout)
		return exitOK
	}
	code := 0
	if err == nil {
		code, err = c.run(a)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "%s: %s\n", a.command, message(err.Error()))
		return exitCode(err)
	}
	return code
}

// splitLeadingFlags splits off the connection flags written before the command, as etcdctl
// takes its global flags ("etcdsync --endpoints X lock NAME"), and returns them (for the
// command to parse with its own), the command's verb ("" if there is none) and what
// follows it. --version before the command is the verb; --help is flag.ErrHelp; any other
// flag there is a usage error.
func splitLeadingFlags(args []string) (lead []string, verb string, rest []string, err error) {
	if len(args) > 0 && (args[0] == "-version" || args[0] == "--version") {
		return nil, args[0], args[1:], nil
	}
	fs := flag.NewFlagSet("etcdsync", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	new(connection).register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, "", nil, err
		}
		return nil, "", nil, usagef("%v: only etcd's connection flags (--endpoints, --user, ...) may come before the command (etcdsync --help)", err)
	}
	lead = args[:len(args)-fs.NArg()]
	if len(lead) > 0 && lead[len(lead)-1] == "--" {
		return nil, "", nil, usagef(`"--" before the command (etcdsync --help)`)
	}
	if fs.NArg() == 0 {
		return lead, "", nil, nil
	}
	return lead, fs.Arg(0), fs.Args()[1:], nil
}
