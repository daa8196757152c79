//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// byToken is what release and ask share: the NAMEs, the token of the hold, the reason,
// where the names' keys are, and the connection.
type byToken struct {
	names  []string
	token  int64
	reason string
	prefix string
	etcd   bool // --etcd-layout
	conn   connection
}

// register defines the flags of byToken, for a command that does verb to the key.
func (b *byToken) register(fs *flag.FlagSet, verb, reason string) {
	fs.Int64Var(&b.token, "token", 0, "the hold's token `T` (status shows it): only the key created at T is "+verb)
	fs.StringVar(&b.reason, "reason", reason, "why (`R`), recorded for the holder to read (up to 1 KiB)")
	fs.StringVar(&b.prefix, "prefix", "", "the names' keys are under this `prefix` (ends with '/')")
	fs.BoolVar(&b.etcd, "etcd-layout", false, "the names' keys are where etcd's own primitives put them (see lock)")
	b.conn.register(fs)
}

// check checks the NAMEs, --prefix and --token, without etcd.
func (b *byToken) check() error {
	switch {
	case len(b.names) == 0:
		return usagef("NAME missing")
	case b.prefix != "" && !strings.HasSuffix(b.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", b.prefix)
	case b.token < 0:
		return usagef("--token %d is negative", b.token)
	}
	return validNames(b.names)
}

// showHolders shows who holds and waits for the names, on stderr, and is exit 64: the
// token to give is among them.
func (b *byToken) showHolders(a *app, ctx context.Context, cli *clientv3.Client, what string) (int, error) {
	snap, err := admin.Status(ctx, cli, b.names, b.options()...)
	if err != nil {
		return 0, failf(exitEtcd, "etcd at %s: %v", b.conn.endpoints, err)
	}
	show := &statusCommand{prefix: b.prefix, etcd: b.etcd}
	if err := show.print(a.stderr, snap); err != nil {
		return 0, err
	}
	return 0, usagef("--token missing: the token of the hold to %s (above)", what)
}

// result is the exit status of admin's Release or Ask, which returned err.
func (b *byToken) result(a *app, err error) (int, error) {
	switch {
	case errors.Is(err, admin.ErrNoHold):
		a.errorf("%v: nothing changed", err)
		return exitFree, nil
	case errors.Is(err, core.ErrInvalidOption):
		return 0, usagef("%v", err)
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", b.conn.endpoints, err)
	}
	return exitOK, nil
}

// options are the admin options of the flags.
func (b *byToken) options() []admin.Option {
	opts := []admin.Option{admin.Prefix(b.prefix)}
	if b.etcd {
		opts = append(opts, admin.EtcdLayout())
	}
	return opts
}

// releaseCommand is `etcdsync release`, parsed.
type releaseCommand struct {
	byToken
	ticket string // --ticket: a detached hold's, instead of NAME and --token
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
	sub.flags.StringVar(&c.ticket, "ticket", "", "release the detached hold of this `TICKET` (lock --detach printed it) instead")
	c.register(sub.flags, "deleted", "")
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
	}
	return c.check()
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
		return c.showHolders(a, ctx, cli, "release")
	}
	return c.result(a, admin.Release(ctx, cli, c.names, c.token, c.reason, c.options()...))
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
