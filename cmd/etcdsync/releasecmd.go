//go:build unix

package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
)

// releaseCommand is `etcdsync release`, parsed.
type releaseCommand struct {
	names  []string
	token  int64
	ticket string // --ticket: a detached hold's, instead of NAME and --token
	reason string
	prefix string
	etcd   bool // --etcd-layout
	conn   connection
}

func (c *releaseCommand) define() *subcommand {
	sub := newSubcommand("release",
		`Ends a hold as an operator: deletes the key of each NAME whose token is T, in one Txn,
only while its token is T (a name taken again since is never touched), and leaves a record
of the reason, who and when, which the holder reads. For a holder that hangs: alive,
renewing, doing nothing. Several NAMEs release a lock of several names (they share one
token). Without --token, shows who holds each NAME and exits 64. A token that no key of a
NAME has changes nothing: exit 1. With --ticket instead, releases the hold that
lock --detach printed that ticket for (exit 1 if it is gone, resumed or taken again).`,
		`# who holds it, and its token
etcdsync status nightly-report
# end that hold, saying why
etcdsync release nightly-report --token 812 --reason "stuck since 02:00"`)
	fs := sub.flags
	fs.Int64Var(&c.token, "token", 0, "the hold's token `T` (status shows it): only the key created at T is deleted")
	fs.StringVar(&c.ticket, "ticket", "", "release the detached hold of this `TICKET` (lock --detach printed it) instead")
	fs.StringVar(&c.reason, "reason", "", "why (`R`), recorded for the holder to read (up to 1 KiB)")
	fs.StringVar(&c.prefix, "prefix", "", "the names' keys are under this `prefix` (ends with '/')")
	fs.BoolVar(&c.etcd, "etcd-layout", false, "the names' keys are where etcd's own primitives put them (see lock)")
	c.conn.register(fs)
	return sub
}

func (c *releaseCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	if err != nil {
		return err
	}
	c.names = names
	switch {
	case c.ticket != "" && (len(names) > 0 || c.token != 0 || c.reason != "" || c.prefix != ""):
		return usagef("--ticket takes no NAME, --token, --reason or --prefix: the ticket names the hold")
	case c.ticket != "":
		if _, err := core.ParseTicket(c.ticket); err != nil {
			return usagef("%v", err)
		}
		return nil
	case len(names) == 0:
		return usagef("NAME missing")
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	case c.token < 0:
		return usagef("--token %d is negative", c.token)
	}
	return validNames(names)
}

// run releases the hold, or without --token shows who holds and exits 64.
func (c *releaseCommand) run(a *app) (int, error) {
	cli, ctx, done, err := c.conn.request()
	if err != nil {
		return 0, err
	}
	defer done()
	if c.ticket != "" {
		return ticketCommand(a, c.conn, func() error {
			t, _ := core.ParseTicket(c.ticket)
			return core.ReleaseTicket(ctx, cli, t)
		})
	}
	if c.token == 0 {
		snap, err := admin.Status(ctx, cli, c.names, c.options()...)
		if err != nil {
			return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
		}
		show := &statusCommand{prefix: c.prefix, etcd: c.etcd}
		if err := show.print(a.stderr, snap); err != nil {
			return 0, err
		}
		return 0, usagef("--token missing: the token of the hold to release (above)")
	}
	err = admin.Release(ctx, cli, c.names, c.token, c.reason, c.options()...)
	switch {
	case errors.Is(err, admin.ErrNoHold):
		a.errorf("%v: nothing changed", err)
		return exitFree, nil
	case errors.Is(err, core.ErrInvalidOption):
		return 0, usagef("%v", err)
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	return exitOK, nil
}

// options are the admin options of the command's flags.
func (c *releaseCommand) options() []admin.Option {
	opts := []admin.Option{admin.Prefix(c.prefix)}
	if c.etcd {
		opts = append(opts, admin.EtcdLayout())
	}
	return opts
}

// ticketCommand runs do, the renewal or release of a detached hold, and maps its error to
// an exit status: 1 for a stale ticket, 69 for etcd's refusal.
func ticketCommand(a *app, conn connection, do func() error) (int, error) {
	err := do()
	switch {
	case errors.Is(err, core.ErrStaleTicket):
		a.errorf("%v: nothing changed", err)
		return exitFree, nil
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", conn.endpoints, err)
	}
	return exitOK, nil
}

// renewCommand is `etcdsync renew`, parsed.
type renewCommand struct {
	ticket core.Ticket
	conn   connection
}

func (c *renewCommand) define() *subcommand {
	sub := newSubcommand("renew",
		`Renews once, for its TTL, the lease of the detached hold that lock --detach printed
TICKET for, and prints the seconds it has left. Exit 1 if the hold is gone (released, its
lease ran out), resumed or taken again.`,
		`# hold the lock for a unit's whole life: taken before it starts, then renewed
etcdsync lock --detach --ttl 5m deploy >/run/deploy.ticket
etcdsync renew "$(cat /run/deploy.ticket)"`)
	c.conn.register(sub.flags)
	return sub
}

func (c *renewCommand) parse(sub *subcommand, args []string, a *app) error {
	operands, err := sub.operands(args, a.getenv)
	if err != nil {
		return err
	}
	if len(operands) != 1 {
		return usagef("one TICKET, not %d operands", len(operands))
	}
	if c.ticket, err = core.ParseTicket(operands[0]); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func (c *renewCommand) run(a *app) (int, error) {
	cli, ctx, done, err := c.conn.request()
	if err != nil {
		return 0, err
	}
	defer done()
	return ticketCommand(a, c.conn, func() error {
		ttl, err := core.RenewTicket(ctx, cli, c.ticket)
		if err == nil {
			fmt.Fprintln(a.stdout, int64(ttl/time.Second))
		}
		return err
	})
}
