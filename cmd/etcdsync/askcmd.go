//go:build unix

package main

import (
	"errors"
	"strings"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
)

// askCommand is `etcdsync ask`, parsed.
type askCommand struct {
	name   string
	token  int64
	reason string
	prefix string
	etcd   bool // --etcd-layout
	conn   connection
}

// defaultAskReason is the reason of an ask without --reason: the record says who asked.
const defaultAskReason = "asked with etcdsync ask"

func (c *askCommand) define() *subcommand {
	sub := newSubcommand("ask",
		`Asks the hold of NAME whose token is T to let go, and exits: it leaves a record beside
the hold's key, only while its token is T (a name taken again since is never asked),
with the reason, who and when; the holder's Asked closes. The holder decides: a Go
program finishes its step and releases (a Do with WithYieldOnAsk has its work's context
end), an etcdsync command with --yield-on-ask stops its command's group (SIGTERM, SIGKILL
after --grace) and releases once it is gone, another goes on. The record goes after ten
minutes. Without --token, shows who holds NAME and exits 64. A token that no key of NAME
has changes nothing: exit 1. An election's leader steps down, as transfer without --to
asks it to.`,
		`# who holds it, and its token
etcdsync status nightly-report
# ask that hold to let go at its next step, saying why
etcdsync ask nightly-report --token 812 --reason "deploy at 02:00"`)
	fs := sub.flags
	fs.Int64Var(&c.token, "token", 0, "the hold's token `T` (status shows it): only the key created at T is asked")
	fs.StringVar(&c.reason, "reason", defaultAskReason, "why (`R`), recorded for the holder to read (up to 1 KiB)")
	fs.StringVar(&c.prefix, "prefix", "", "the name's keys are under this `prefix` (ends with '/')")
	fs.BoolVar(&c.etcd, "etcd-layout", false, "the name's keys are where etcd's own primitives put them (see lock)")
	c.conn.register(fs)
	return sub
}

func (c *askCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	if err != nil {
		return err
	}
	switch {
	case len(names) == 0:
		return usagef("NAME missing")
	case len(names) > 1:
		return usagef("%d names: ask asks the hold of one NAME (a lock of several is asked through any of them)", len(names))
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	case c.token < 0:
		return usagef("--token %d is negative", c.token)
	case c.reason == "":
		return usagef("--reason is empty: the holder is told why it is asked")
	}
	c.name = names[0]
	return validNames(names)
}

// run asks the hold, or without --token shows who holds and exits 64.
func (c *askCommand) run(a *app) (int, error) {
	cli, ctx, done, err := c.conn.request()
	if err != nil {
		return 0, err
	}
	defer done()
	opts := (&releaseCommand{prefix: c.prefix, etcd: c.etcd}).options()
	if c.token == 0 {
		snap, err := admin.Status(ctx, cli, []string{c.name}, opts...)
		if err != nil {
			return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
		}
		show := &statusCommand{prefix: c.prefix, etcd: c.etcd}
		if err := show.print(a.stderr, snap); err != nil {
			return 0, err
		}
		return 0, usagef("--token missing: the token of the hold to ask (above)")
	}
	err = admin.Ask(ctx, cli, c.name, c.token, c.reason, opts...)
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
