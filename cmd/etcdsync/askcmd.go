//go:build unix

package main

import (
	"github.com/etcdsync/etcdsync/admin"
)

// askCommand is `etcdsync ask`, parsed.
type askCommand struct{ byToken }

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
	c.register(sub.flags, "asked", defaultAskReason)
	return sub
}

func (c *askCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	if err != nil {
		return err
	}
	c.names = names
	switch {
	case len(names) > 1:
		return usagef("%d names: ask asks the hold of one NAME (a lock of several is asked through any of them)", len(names))
	case c.reason == "":
		return usagef("--reason is empty: the holder is told why it is asked")
	}
	return c.check()
}

// run asks the hold, or without --token shows who holds and exits 64.
func (c *askCommand) run(a *app) (int, error) {
	cli, ctx, done, err := c.conn.request()
	if err != nil {
		return 0, err
	}
	defer done()
	if c.token == 0 {
		return c.showHolders(a, ctx, cli, "ask")
	}
	return c.result(a, admin.Ask(ctx, cli, c.names[0], c.token, c.reason, c.options()...))
}
