//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
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

// errorf reports why the command ends, on one line, after the command's prefix alone
// ("etcdsync release: stale ticket: nothing changed", never "etcdsync release: etcdsync: ").
func (a *app) errorf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "%s: %s\n", a.command, message(fmt.Sprintf(format, args...)))
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
	case "lock", "rlock", "sem", "elect", "once":
		return &holdCommand{verb: verb}
	case "status":
		return &statusCommand{}
	case "release":
		return &releaseCommand{}
	case "ask":
		return &askCommand{}
	case "delete":
		return &deleteCommand{}
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
		a.errorf("%v", err)
		return exitCode(err)
	case verb == "":
		fmt.Fprintln(a.stderr, "etcdsync: no command: "+verbList+" (etcdsync --help)")
		return exitUsage
	}
	switch verb {
	case "-version", "--version", "version":
		printVersion(a.stdout)
		return exitOK
	case "help":
		return help(a, args)
	}
	c := newCommand(verb)
	if c == nil {
		fmt.Fprintf(a.stderr, "etcdsync: no command %q: %s (etcdsync --help)\n", verb, verbList)
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
		a.errorf("%v", err)
		return exitCode(err)
	}
	return code
}

// verbList lists the commands, for the messages that name none or an unknown one.
const verbList = "lock, rlock, sem, elect, transfer, barrier, latch, status, release, ask, renew or delete"

// help is `etcdsync help [TOPIC]`: etcdsync's help, or a command's. A topic that is no
// command, or more than one, is a usage error.
func help(a *app, topics []string) int {
	a.command = "etcdsync help"
	switch {
	case len(topics) == 0, len(topics) == 1 && (topics[0] == "help" || topics[0] == "version"):
		printHelp(a.stdout)
		return exitOK
	case len(topics) > 1:
		a.errorf("one COMMAND, not %d: etcdsync help COMMAND", len(topics))
		return exitUsage
	}
	c := newCommand(topics[0])
	if c == nil {
		a.errorf("no command %q: %s (etcdsync --help)", topics[0], verbList)
		return exitUsage
	}
	c.define().printHelp(a.stdout)
	return exitOK
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
		name, msg := flagProblem(fs, err)
		if undefinedFlag.MatchString(err.Error()) {
			return nil, "", nil, usagef("%s: only etcd's connection flags (--endpoints, --user, ...) may come before the command (etcdsync --help)", spelled(name))
		}
		return nil, "", nil, usagef("%s (etcdsync --help)", msg)
	}
	lead = slices.Clone(args[:len(args)-fs.NArg()]) // the caller appends to it: not into args
	if len(lead) > 0 && lead[len(lead)-1] == "--" {
		return nil, "", nil, usagef(`"--" before the command (etcdsync --help)`)
	}
	if fs.NArg() == 0 {
		return lead, "", nil, nil
	}
	return lead, fs.Arg(0), fs.Args()[1:], nil
}
