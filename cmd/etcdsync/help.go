//go:build unix

package main

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// usages are etcdsync's commands as its usage lists them: the one source of their synopses,
// which `etcdsync --help` and `etcdsync help COMMAND` print and a test holds doc.go and
// docs/command.md to.
var usages = []struct{ verb, synopsis string }{
	{"lock", "[flags] NAME [NAME...] [-- CMD [ARGS...]]"},
	{"rlock", "[flags] NAME [-- CMD [ARGS...]]"},
	{"sem", "-n N [--units K] [flags] NAME [-- CMD [ARGS...]]"},
	{"elect", "[flags] NAME [PROPOSAL] [-- CMD [ARGS...]]"},
	{"once", "--every D [flags] NAME [--] CMD [ARGS...]"},
	{"transfer", "[--to VALUE] [flags] NAME"},
	{"barrier", "-n N [flags] NAME [-- CMD [ARGS...]]"},
	{"latch", "[flags] NAME (--set N|--down|--wait|--count|--delete)"},
	{"status", "[--json] [--watch | --check] [flags] [NAME...]"},
	{"release", "--token T [--reason R] [flags] NAME... | --ticket TICKET"},
	{"ask", "--token T [--reason R] [flags] NAME"},
	{"renew", "[flags] TICKET"},
	{"delete", "[flags] NAME..."},
	{"help", "[COMMAND]"},
	{"version", ""},
}

// synopsis is verb's usage line after "etcdsync ".
func synopsis(verb string) string {
	for _, u := range usages {
		if u.verb == verb {
			return verb + " " + u.synopsis
		}
	}
	return verb
}

// usageLines are the lines of etcdsync's usage, the verbs aligned.
func usageLines() []string {
	var lines []string
	for _, u := range usages {
		lines = append(lines, strings.TrimRight(fmt.Sprintf("etcdsync %-8s %s", u.verb, u.synopsis), " "))
	}
	return lines
}

// printHelp writes etcdsync's own help, every line within helpWidth.
func printHelp(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage:\n  %s\n\n%s\n\n", wrap(helpAbout, ""), strings.Join(usageLines(), "\n  "), wrap(helpCommands, ""))
	fmt.Fprintf(w, "%s\n", wrap(helpExitStatus, ""))
	for _, s := range exitStatuses {
		fmt.Fprintf(w, "%s\n", wrapHanging(s.text, fmt.Sprintf("  %-6s ", s.code), strings.Repeat(" ", 9)))
	}
	fmt.Fprintf(w, "\n%s\n", wrap(helpConnection, ""))
}

const helpAbout = `etcdsync runs a command under a distributed lock, read lock, semaphore permit or
leadership held in etcd, and shows who holds and who waits; it also starts commands
together at a barrier, and counts down latches.`

const helpCommands = `lock, rlock, sem and elect wait their turn, first come first served, then run CMD in
a process group of its own, with ETCDSYNC_NAME, ETCDSYNC_KEY and ETCDSYNC_TOKEN (the
fencing token) in its environment, and release when its group is gone: lock one at a
time, rlock many readers but never beside an rwmutex writer, sem at most N at a time,
elect only the leader. CMD follows NAME, as with etcdctl lock NAME CMD ARGS..., or a
"--" after it. lock of several names takes all of them at once, or none (no deadlock,
whatever order others list them in), and needs a "--" after the last name. elect NAME
PROPOSAL campaigns with PROPOSAL as its value, as etcdctl elect does, and takes CMD only
after "--". Without CMD, etcdsync holds until SIGINT, SIGTERM or SIGHUP. once --every D
runs CMD as lock does, but at most once per period D across every host: a period whose
run exited 0 is recorded done, and a later once finds it so and exits 0 at once.

release ends the hold whose token is T (fenced: a NAME taken again since is never
touched), with a reason its holder reads; ask asks that hold to let go, and a command
run with --yield-on-ask then stops its CMD and releases. lock --detach takes the lock, prints a ticket
and exits, leaving the hold for its --ttl: renew TICKET renews it once, release --ticket
TICKET releases it, and Go's mutex.Resume takes it over. transfer asks an election's
leader to hand its leadership to another candidate, or to step down. status shows what
each NAME is (lock, rwmutex, semaphore, election, barrier, latch), who holds it and who
waits, and an election's leader and candidates by their values; without NAME, every name
at the root of the keyspace, or under --prefix P. delete removes a name's lasting records
(a semaphore's limit, a barrier's, a latch's) once nobody holds or waits: a name serves
one kind of primitive, and refuses another (exit 64) while those records are there.

barrier -n N enters the double barrier NAME, runs CMD once N participants have entered,
as lock runs its CMD (with ETCDSYNC_NAME and ETCDSYNC_ROUND, the round's number: a
barrier has no fencing token), then leaves and waits until every participant of its
round has left; without CMD, it enters and leaves at once. latch sets (--set N), counts
down (--down; with --as ID once per ID), awaits (--wait), prints (--count) or deletes
(--delete) the countdown latch NAME.

Stopping: when the hold is lost, or --max-hold passes, the command's whole group gets
SIGTERM at once; the first SIGINT, SIGTERM or SIGHUP etcdsync gets goes to the group.
Either way SIGKILL follows after --grace (10s), or at once on a second signal, and the
hold is released only once the group is gone.`

const helpExitStatus = `Exit status: the command's own (128+N if it died of signal N; N for every status but
0 with --command-failed N), or etcdsync's:`

// exitStatuses are etcdsync's own exit statuses, as its help lists them.
var exitStatuses = []struct{ code, text string }{
	{"0", "without CMD: released after SIGINT, SIGTERM or SIGHUP, or when asked (--yield-on-ask); elect: the leadership was handed over (transfer, --prefer), its CMD stopped; barrier without CMD: every participant of the round has left"},
	{"1", "status --check: a NAME is free (0: every one is held); release, ask: no key of a NAME has that token, nothing changed; transfer: nobody leads, or no candidate has that value, or it did not take over, nothing changed; latch: set already (--set), not set (--down, --count), nothing changed, or deleted while awaited; delete: a NAME is held or waited for, nothing deleted"},
	{"64", "usage: a bad flag, argument or name; a NAME that holds another kind of primitive's keys or records (etcdsync delete removes records), nothing written"},
	{"69", "etcd could not be reached, or refused (TLS, login, permission), or the wait failed; not for a waiter whose key or lease was removed: it waits again"},
	{"75", "--try: the name is busy; transfer: another transfer is asked already"},
	{"123", "--max-hold passed: the command was stopped, then the hold released"},
	{"124", "--timeout passed before the hold was granted (transfer: the leader did not answer; barrier: before N had entered; latch --wait: before the count was zero)"},
	{"125", "the hold was lost while the command ran; it was stopped (or an operator released the wait: etcdsync release; barrier: the participant's key went while it entered, ran CMD or left: the others counted it as gone)"},
	{"126", "the command could not be run"},
	{"127", "the command was not found"},
	{"128+N", "signal N: while waiting (barrier: entering or leaving; latch --wait), or the command was stopped by it (whatever its status)"},
}

const helpConnection = `etcd is reached as etcdctl reaches it: --endpoints, --cacert, --cert, --key, --user,
--password, --dial-timeout, --command-timeout, or ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ...
in the environment. These flags may come before the command too, as etcdctl's global
flags do (etcdsync --endpoints HOST:2379 lock NAME). etcdsync help COMMAND shows a
command's flags and an example; etcdsync version (or --version) the version of etcdsync
and of Go.`

func indent(text string) string {
	return "  " + strings.ReplaceAll(strings.TrimSpace(text), "\n", "\n  ")
}

// helpWidth is the width of every help text, in columns (a test holds them to it).
const helpWidth = 80

// wrap fills text to helpWidth columns, every line after prefix: its paragraphs (apart by
// a blank line) each reflowed, their words kept whole.
func wrap(text, prefix string) string { return wrapHanging(text, prefix, prefix) }

// wrapHanging is wrap with first, not prefix, before the text's first line.
func wrapHanging(text, first, prefix string) string {
	var out []string
	for para := range strings.SplitSeq(strings.TrimSpace(text), "\n\n") {
		line, start := first, first
		for word := range strings.FieldsSeq(para) {
			if line != start && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > helpWidth {
				out = append(out, line)
				line, start = prefix, prefix
			}
			if line != start {
				line += " "
			}
			line += word
		}
		out = append(out, line, "")
		first = prefix
	}
	return strings.Join(out[:len(out)-1], "\n")
}
