//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
)

// releaseCommand is `etcdsync release`, parsed.
type releaseCommand struct {
	names  []string
	token  int64
	reason string
	prefix string
	conn   connection
}

func (c *releaseCommand) define() *subcommand {
	sub := newSubcommand("release",
		`Ends a hold as an operator: deletes the key of each NAME whose token is T, in one Txn,
only while its token is T (a name taken again since is never touched), and leaves a record
of the reason, who and when, which the holder reads. For a holder that hangs: alive,
renewing, doing nothing. Several NAMEs release a lock of several names (they share one
token). Without --token, shows who holds each NAME and exits 64. A token that no key of a
NAME has changes nothing: exit 1.`,
		`# who holds it, and its token
etcdsync status nightly-report
# end that hold, saying why
etcdsync release nightly-report --token 812 --reason "stuck since 02:00, ticket OPS-17"`)
	fs := sub.flags
	fs.Int64Var(&c.token, "token", 0, "the hold's token `T` (status shows it): only the key created at T is deleted")
	fs.StringVar(&c.reason, "reason", "", "why, recorded for the holder to read (up to 1 KiB)")
	fs.StringVar(&c.prefix, "prefix", "", "the names' keys are under this `prefix` (ends with '/')")
	c.conn.register(fs)
	return sub
}

func (c *releaseCommand) parse(sub *subcommand, args []string, a *app) error {
	names, _, err := sub.parse(args, -1)
	if err != nil {
		return err
	}
	if err := applyEnv(sub.flags, a.getenv); err != nil {
		return err
	}
	c.names = names
	switch {
	case len(names) == 0:
		return usagef("NAME missing")
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	case c.token < 0:
		return usagef("--token %d is negative", c.token)
	}
	for _, n := range names {
		if err := core.ValidateName(n); err != nil {
			return usagef("%v", err)
		}
	}
	return nil
}

// run releases the hold, or without --token shows who holds and exits 64.
func (c *releaseCommand) run(a *app) (int, error) {
	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	if c.token == 0 {
		snap, err := admin.Status(ctx, cli, c.names, admin.WithPrefix(c.prefix))
		if err != nil {
			return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
		}
		show := &statusCommand{prefix: c.prefix}
		if err := show.print(a.stderr, snap); err != nil {
			return 0, err
		}
		return 0, usagef("--token missing: the token of the hold to release (above)")
	}
	err = admin.Release(ctx, cli, c.names, c.token, c.reason, admin.WithPrefix(c.prefix))
	switch {
	case errors.Is(err, admin.ErrNoHold):
		fmt.Fprintf(a.stderr, "%s: %v: nothing changed\n", a.command, err)
		return exitFree, nil
	case errors.Is(err, core.ErrInvalidOption):
		return 0, usagef("%v", err)
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	return exitOK, nil
}
