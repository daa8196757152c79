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

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/latch"
)

// latchCommand is `etcdsync latch`, parsed: one action on one latch.
type latchCommand struct {
	name    string
	action  string // set, down, wait, count or delete
	count   int    // --set N
	down    bool
	as      string // --down --as ID: the participant that counts down
	wait    bool
	show    bool // --count
	del     bool // --delete
	prefix  string
	timeout time.Duration
	conn    connection
}

// latchActions are the flags of latch's actions, one of which a command line takes.
var latchActions = []string{"set", "down", "wait", "count", "delete"}

func (c *latchCommand) define() *subcommand {
	sub := newSubcommand("latch",
		`Acts on the countdown latch NAME, a count kept in etcd without a lease (Go's
etcdsync/latch on the same name shares it): --set N sets the count, once per name (exit
1 if it was set already: nothing changed); --down counts down by one (exit 1 if it is not
set: nothing changed), and with --as ID counts once per ID, however often ID tries again;
--wait waits until the count is zero, for its --set first if it has none (exit 1 if the
latch is deleted meanwhile, 124 after --timeout); --count prints the count (exit 1 if it
is not set); --delete deletes its count and count downs, so that the name may be set
again (delete once the waiters have returned). One action per command.`,
		`# tonight's import waits for its three shards, however long they take
etcdsync latch import-2026-11-24 --set 3
etcdsync latch import-2026-11-24 --wait --timeout 2h && ./publish-import
# each shard, when done; a shard that runs again counts once
etcdsync latch import-2026-11-24 --down --as "shard-$SHARD"`)
	fs := sub.flags
	fs.IntVar(&c.count, "set", 0, fmt.Sprintf("set the count to `N`, from 1 to %d, once per name (exit 1 if set already)", latch.MaxCount))
	fs.BoolVar(&c.down, "down", false, "count down by one (exit 1 if the latch is not set); at zero, nothing changes")
	fs.StringVar(&c.as, "as", "", "with --down: count down as the participant `ID`, once for the life of the count, however often it tries")
	fs.BoolVar(&c.wait, "wait", false, "wait until the count is zero, for the --set first if there was none (exit 1 if the latch is deleted meanwhile)")
	fs.BoolVar(&c.show, "count", false, "print the count (exit 1 if the latch is not set)")
	fs.BoolVar(&c.del, "delete", false, "delete the latch's count and count downs; a waiter's count above zero then fails")
	fs.StringVar(&c.prefix, "prefix", "", "the name's keys are under this `prefix` (ends with '/')")
	fs.DurationVar(&c.timeout, "timeout", 0, "with --wait: give up after this long (exit 124); 0 waits forever")
	c.conn.register(fs)
	return sub
}

func (c *latchCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	if err != nil {
		return err
	}
	set := setFlags(sub.flags)
	chosen := map[string]bool{"set": set["set"], "down": c.down, "wait": c.wait, "count": c.show, "delete": c.del}
	var actions []string
	for _, f := range latchActions {
		if chosen[f] {
			actions = append(actions, "--"+f)
		}
	}
	switch {
	case len(names) != 1:
		return usagef("one NAME, the latch's, expected; got %d", len(names))
	case len(actions) == 0:
		return usagef("no action: --set N, --down, --wait, --count or --delete (etcdsync latch --help)")
	case len(actions) > 1:
		return usagef("%s: one action at a time", strings.Join(actions, " and "))
	case chosen["set"] && (c.count < 1 || c.count > latch.MaxCount):
		return usagef("--set %d: from 1 to %d", c.count, latch.MaxCount)
	case set["as"] && !c.down:
		return usagef("--as names who counts down: with --down only")
	case c.timeout < 0:
		return usagef("--timeout %v is negative", c.timeout)
	case set["timeout"] && !c.wait:
		return usagef("--timeout bounds --wait only")
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	}
	if set["as"] {
		if err := core.ValidateName(c.as); err != nil {
			return usagef("--as: %v", err)
		}
	}
	c.name, c.action = names[0], strings.TrimPrefix(actions[0], "--")
	return validNames(names)
}

// what names the latch, for messages: `latch "import"`.
func (c *latchCommand) what() string { return fmt.Sprintf("latch %q", c.name) }

// run does the action: --wait until the count is zero, --timeout or a signal; the others
// within --command-timeout.
func (c *latchCommand) run(a *app) (int, error) {
	var sigc chan os.Signal
	if c.action == "wait" { // a signal ends the wait
		sigc = make(chan os.Signal, 1)
		signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigc)
	}
	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	var opts []latch.Option
	if c.prefix != "" {
		opts = append(opts, latch.WithPrefix(c.prefix))
	}
	l, err := latch.New(cli, c.name, opts...)
	if err != nil {
		return 0, usagef("%v", err)
	}
	if err := c.conn.probe(cli, c.prefix+core.NamePrefix(c.name)); err != nil {
		return 0, err
	}
	if c.action == "wait" {
		return c.await(l, sigc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	switch c.action {
	case "set":
		err = l.Set(ctx, c.count)
		if errors.Is(err, latch.ErrAlreadySet) {
			return 0, failf(exitFree, "%s is set already: nothing changed", c.what())
		}
	case "down":
		err = l.CountDownAs(ctx, c.as)
	case "count":
		var n int
		if n, err = l.Count(ctx); err == nil {
			fmt.Fprintln(a.stdout, n)
		}
	case "delete":
		err = l.Delete(ctx)
	}
	switch {
	case errors.Is(err, core.ErrOtherKind):
		return 0, fail(exitUsage, err)
	case errors.Is(err, latch.ErrNotSet):
		return 0, failf(exitFree, "%s is not set: nothing changed", c.what())
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	return exitOK, nil
}

// await waits until the latch's count is zero, until --timeout or a signal.
func (c *latchCommand) await(l *latch.Latch, sigc <-chan os.Signal) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Await(ctx) }()
	var err error
	select {
	case err = <-errc:
	case sig := <-sigc:
		cancel()
		<-errc
		return 0, failf(exitSignal+signum(sig), "%s while waiting for %s", signame(sig), c.what())
	}
	switch {
	case err == nil:
		return exitOK, nil
	case c.timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return 0, failf(exitTimeout, "%s not at zero within %v", c.what(), c.timeout)
	case errors.Is(err, latch.ErrNotSet):
		return 0, failf(exitFree, "%s was deleted while its count was above zero", c.what())
	default:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
}
