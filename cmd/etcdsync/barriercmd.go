//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/core"
)

// barrierCommand is `etcdsync barrier`, parsed. Its command runs as a hold command's does:
// runner is a holdCommand that only runs it (runCommand, supervise).
type barrierCommand struct {
	name          string
	command       []string // what to run; nil to enter and leave at once
	n             int
	ttl           time.Duration
	prefix        string
	timeout       time.Duration
	grace         time.Duration
	commandFailed int
	shell         bool
	verbose       bool
	conn          connection

	runner *holdCommand
}

func (c *barrierCommand) define() *subcommand {
	sub := newSubcommand("barrier",
		`Enters the double barrier of N participants on NAME, waits until N have entered (this
one among them), runs CMD, then leaves, waits until every participant of its round has
left, and exits with CMD's status. CMD follows NAME, or a "--" after it, as lock's does.
Participants come from any host: etcdsync barrier, or Go's etcdsync/barrier on the same
name. They meet in rounds of N: those that come after a round filled make the next one.
CMD runs as lock runs its CMD (its own process group, signals passed on, --grace), with
ETCDSYNC_NAME and ETCDSYNC_ROUND (the round's number: 1, 2, ...); a barrier gives no
fencing token, so there is no ETCDSYNC_KEY or ETCDSYNC_TOKEN. If this participant's key
goes while CMD runs (its lease expired or was revoked), the others count it as gone: CMD
is stopped, exit 125. Without CMD, it enters and leaves at once: a rendezvous point, exit
0 once every participant of the round has left. Every participant of a name gives the
same N: another is exit 64.`,
		`# four workers start the next step together, and finish it together
etcdsync barrier -n 4 batch-42 -- ./step --shard "$SHARD"
# a rendezvous for a script on three hosts: go on once all three are there
etcdsync barrier -n 3 --timeout 10m deploy-ready && ./switch-traffic`)
	fs := sub.flags
	fs.IntVar(&c.n, "n", 0, fmt.Sprintf("how many (`N`) participants enter together, from 1 to %d; the same for every participant of NAME (required)", barrier.MaxParticipants))
	fs.DurationVar(&c.ttl, "ttl", barrier.DefaultTTL, "lease TTL: how long the others count this participant as there if etcdsync dies or loses etcd")
	fs.StringVar(&c.prefix, "prefix", "", "put the name's keys under this `prefix`, which ends with '/'")
	fs.DurationVar(&c.timeout, "timeout", 0, "give up entering after this long, before N have entered (exit 124); 0 waits forever. It does not bound CMD, nor the wait for the others to leave")
	fs.DurationVar(&c.grace, "grace", 10*time.Second, "after SIGTERM to the command's process group (on a loss, or passed on from etcdsync's first SIGINT, SIGTERM or SIGHUP), SIGKILL after this long; a second signal sends it at once")
	fs.IntVar(&c.commandFailed, "command-failed", 0, "exit `N` whenever the command exits non-zero or dies of a signal, so that its status never reads as one of etcdsync's own; N from 1 to 122 but 64, 69, 75")
	fs.BoolVar(&c.shell, "shell", false, "run CMD ARGS... joined by spaces with /bin/sh -c")
	fs.BoolVar(&c.verbose, "verbose", false, "log every step to stderr, with times")
	c.conn.register(fs)
	return sub
}

// parse reads NAME, the command after it (as commandLine reads them), the flags and
// ETCDCTL_* variables, and checks what can be checked without etcd.
func (c *barrierCommand) parse(sub *subcommand, args []string, a *app) error {
	operands, rest, err := sub.commandLine(args, false)
	if err != nil {
		return err
	}
	if err := applyEnv(sub.flags, a.getenv); err != nil {
		return err
	}
	a.verbose = c.verbose
	set := setFlags(sub.flags)
	switch {
	case len(operands) == 0:
		return usagef("NAME missing (etcdsync barrier --help)")
	case len(operands) > 1:
		return usagef("%d names before \"--\": barrier takes one NAME (only lock takes several)", len(operands))
	case !set["n"]:
		return usagef("-n N missing: how many participants enter together")
	case c.n < 1 || c.n > barrier.MaxParticipants:
		return usagef("-n %d: from 1 to %d participants", c.n, barrier.MaxParticipants)
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	case c.timeout < 0:
		return usagef("--timeout %v is negative", c.timeout)
	case c.grace < 0:
		return usagef("--grace %v is negative", c.grace)
	case set["command-failed"] && !freeStatus(c.commandFailed):
		return usagef("--command-failed %d: from 1 to 122, but not 64, 69 or 75, which are etcdsync's own", c.commandFailed)
	case set["command-failed"] && len(rest) == 0:
		return usagef("--command-failed without a command")
	case c.shell && len(rest) == 0:
		return usagef("--shell without a command")
	}
	if err := validNames(operands); err != nil {
		return err
	}
	if err := refuseLineBreaks(operands[0], "name"); err != nil {
		return err
	}
	if err := refuseLineBreaks(c.prefix, "--prefix"); err != nil {
		return err
	}
	c.name = operands[0]
	if len(rest) > 0 {
		c.command = rest
	}
	c.runner = &holdCommand{verb: "barrier", name: c.name, names: []string{c.name}, command: c.command,
		grace: c.grace, shell: c.shell, commandFailed: c.commandFailed}
	return nil
}

// what names the barrier, for messages: `barrier "batch-42"`.
func (c *barrierCommand) what() string { return fmt.Sprintf("barrier %q", c.name) }

// participant is this process's place in a barrier as a hold of the hold commands, so that
// its command runs as theirs (runCommand): Done closes when its key goes. It has no key to
// show and its token fences nothing: the command's environment has ETCDSYNC_ROUND instead
// (see holdCommand.environment). Its release is Leave.
type participant struct{ b *barrier.Barrier }

// errParticipantGone is why a participant's Done closed before it left.
var errParticipantGone = fmt.Errorf("%w: its key went, its lease expired or revoked, or the key deleted: the others count it as gone", barrier.ErrLost)

func (p participant) Key() string                       { return "" }
func (p participant) Token() int64                      { return p.b.Token() }
func (p participant) Round() int64                      { return p.b.Round() }
func (p participant) Done() <-chan struct{}             { return p.b.Done() }
func (p participant) release(ctx context.Context) error { return p.b.Leave(ctx) }

func (p participant) Err() error {
	select {
	case <-p.b.Done():
		return errParticipantGone
	default:
		return nil
	}
}

// run enters, runs the command (if any), leaves, and returns the exit status: the
// command's, or one of etcdsync's own with the error that says why.
func (c *barrierCommand) run(a *app) (int, error) {
	// From here on a signal is ours to handle: it cancels a wait, or goes to the command.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)

	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	// Revokes the lease if the participant's key is still on it (a loss, a signal, a command
	// that could not run: it did not leave), so that the others need not wait its TTL.
	defer c.shutdown(a, cli)
	opts := []barrier.Option{barrier.WithTTL(c.ttl)}
	if c.prefix != "" {
		opts = append(opts, barrier.WithPrefix(c.prefix))
	}
	b, err := barrier.New(cli, c.name, c.n, opts...)
	if err != nil {
		return 0, usagef("%v", err)
	}
	if err := c.conn.probe(cli, c.prefix+core.NamePrefix(c.name)); err != nil {
		return 0, err
	}
	if err := c.enter(a, b, sigc); err != nil {
		return 0, err
	}
	p := participant{b}
	p.Done() // watch the key from now on, so that a loss is known at once
	code, ran := exitOK, ""
	if c.command != nil {
		code, err = c.runner.runCommand(a, p, sigc, nil)
		if err != nil {
			return 0, err // lost, or not run: the shutdown takes the key away, if it is there
		}
		if c.runner.stopSignal != nil {
			return code, nil // stopped by a signal: no wait for the others
		}
		ran = fmt.Sprintf(" (the command's status: %d)", code)
	}
	if err := c.leave(a, b, sigc, ran); err != nil {
		return 0, err
	}
	return code, nil
}

// enter enters the barrier, until --timeout or a signal. An Enter cut short leaves no key:
// the library deletes it before it returns.
func (c *barrierCommand) enter(a *app, b *barrier.Barrier, sigc <-chan os.Signal) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	start := time.Now()
	a.logf("%s: entering, %d participants (ttl %v)", c.what(), c.n, c.ttl)
	errc := make(chan error, 1)
	go func() { errc <- b.Enter(ctx) }()
	var err error
	select {
	case err = <-errc:
	case sig := <-sigc:
		cancel()
		<-errc // entered meanwhile or not, the shutdown takes the key away
		return failf(exitSignal+signum(sig), "%s while entering %s", signame(sig), c.what())
	}
	switch {
	case err == nil:
	case c.timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return failf(exitTimeout, "%s: %d participants had not entered within %v: this one withdrew", c.what(), c.n, c.timeout)
	case errors.Is(err, barrier.ErrInvalidOption):
		return usagef("-n %d: %v", c.n, err)
	case errors.Is(err, core.ErrOtherKind):
		return fail(exitUsage, err)
	case errors.Is(err, barrier.ErrLost):
		// Entering again could count this participant twice, if its round filled before the
		// key went: the round it was in may have gone on without it.
		return failf(exitLost, "%s: this participant's key went while it entered (its lease expired or was revoked, or the key was deleted): %v", c.what(), err)
	default:
		return fail(exitEtcd, err)
	}
	a.logf("%s: entered after %v: round %d, token %d", c.what(), time.Since(start).Round(time.Millisecond), b.Round(), b.Token())
	return nil
}

// leave leaves the barrier and waits until every participant of the round has left, or a
// signal; ran says how the command ended, for the messages.
func (c *barrierCommand) leave(a *app, b *barrier.Barrier, sigc <-chan os.Signal, ran string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start, round := time.Now(), b.Round()
	a.logf("%s: leaving: waiting until every participant of round %d has left", c.what(), round)
	errc := make(chan error, 1)
	go func() { errc <- b.Leave(ctx) }()
	var err error
	select {
	case err = <-errc:
	case sig := <-sigc:
		cancel()
		<-errc // having deleted the key, or the shutdown does
		return failf(exitSignal+signum(sig), "%s while leaving %s, before every participant had left%s", signame(sig), c.what(), ran)
	}
	switch {
	case err == nil:
		a.logf("%s: every participant of round %d has left, after %v", c.what(), round, time.Since(start).Round(time.Millisecond))
		return nil
	case errors.Is(err, barrier.ErrLost):
		return failf(exitLost, "%s: this participant's key went before it left: the others counted it as gone%s", c.what(), ran)
	default:
		return failf(exitEtcd, "%s: not every participant was seen to leave%s: %v", c.what(), ran, err)
	}
}

// shutdown revokes the client's lease if a key is still on it, within --command-timeout.
func (c *barrierCommand) shutdown(a *app, cli *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	if err := barrier.Shutdown(ctx, cli); err != nil {
		a.logf("%s: lease not revoked (it expires in %v): %v", c.what(), c.ttl, err)
	}
}
