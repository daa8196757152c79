//go:build unix

package main

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The command's own exit statuses. Every other status is the command's it ran: its exit
// status, or 128+N when it died of signal N. The codes follow the tools users know: sysexits
// for usage, unavailable and try-again-later, timeout(1) for 124, env(1) and sh for 126
// and 127.
const (
	exitOK        = 0
	exitFree      = 1   // status --check: a name is free; release: no hold has that token; latch: (not) set
	exitUsage     = 64  // EX_USAGE: a bad flag, argument, name, or --units above etcd's limit
	exitEtcd      = 69  // EX_UNAVAILABLE: etcd unreachable or refusing (TLS, auth, permission)
	exitBusy      = 75  // EX_TEMPFAIL: --try found the name busy
	exitMaxHold   = 123 // --max-hold passed: the hold ended by itself and the command was stopped
	exitTimeout   = 124 // --timeout passed before the hold was granted (N entered, a latch's zero), as timeout(1)
	exitLost      = 125 // the hold (a barrier's participant) was lost while the command ran: it was stopped
	exitCannotRun = 126 // the command was found but could not be run
	exitNotFound  = 127 // the command was not found
	exitSignal    = 128 // + N: interrupted by signal N before the command ran
)

// freeStatus reports whether etcdsync never exits with status of its own: from 1 to 123, but
// 64, 69 and 75. --command-failed takes one of them.
func freeStatus(status int) bool {
	return status >= 1 && status < exitMaxHold && status != exitUsage && status != exitEtcd && status != exitBusy
}

// failure is an error that ends the command with code, reported as one line.
type failure struct {
	code int
	err  error
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// fail wraps err to end the command with code.
func fail(code int, err error) error { return &failure{code: code, err: err} }

// failf is fail with a formatted error.
func failf(code int, format string, args ...any) error {
	return &failure{code: code, err: fmt.Errorf(format, args...)}
}

// usagef is a usage error: exit 64.
func usagef(format string, args ...any) error { return failf(exitUsage, format, args...) }

// exitCode is the status err ends the command with: its failure's code, else exitEtcd (the
// errors that carry no code come from etcd or the client).
func exitCode(err error) int {
	var f *failure
	if errors.As(err, &f) {
		return f.code
	}
	return exitEtcd
}

// packagePrefix is the prefix of the errors of etcdsync's packages ("etcdsync: invalid name")
// where a message has one: at its start, after ": " or after "(".
var packagePrefix = regexp.MustCompile(`(^|: |\()etcdsync: `)

// message is err's text as etcdsync writes it after its own prefix ("etcdsync lock: "): one
// line, without the packages' "etcdsync: " again ("etcdsync lock: invalid name: empty").
func message(err string) string {
	return oneLine(packagePrefix.ReplaceAllString(err, "$1"))
}

// lostAgain is the packages' "lost: " in a message (after message) that says so already.
var lostAgain = regexp.MustCompile(`(^|: )lost: `)

// lossCause says why a hold or a wait ended, for a message that says it was lost already:
// without the packages' "lost: " again, and an operator's release as "released by an
// operator, bob@ops at 2026-11-24T02:30:00Z, reason: "stuck"" (or "no reason given").
func lossCause(err error) string {
	var rel *core.ReleasedError
	if !errors.As(err, &rel) {
		return lostAgain.ReplaceAllString(message(err.Error()), "$1")
	}
	text := fmt.Sprintf("released by an operator, %s at %s", rel.Record.By, rel.Record.At.Format(time.RFC3339))
	if rel.Record.Reason == "" {
		return text + ", no reason given"
	}
	return text + ", reason: " + strconv.Quote(rel.Record.Reason)
}

// oneLine makes msg one line, so that every error is one line on stderr: a multi-line error
// (errors.Join) has its lines joined with "; ".
func oneLine(msg string) string {
	lines := strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\r' })
	return strings.Join(lines, "; ")
}
