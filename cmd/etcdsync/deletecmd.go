//go:build unix

package main

import (
	"errors"
	"strings"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
)

// deleteCommand is `etcdsync delete`, parsed.
type deleteCommand struct {
	names  []string
	prefix string
	etcd   bool // --etcd-layout
	conn   connection
}

func (c *deleteCommand) define() *subcommand {
	sub := newSubcommand("delete",
		`Removes what each NAME keeps in etcd once nobody uses it: a semaphore's limit, a
barrier's records, a latch's count. These outlive every holder on purpose; a name that
holds them refuses another kind of primitive (exit 64, naming the key). Only while no key
of any NAME is held or waited for, in one Txn; else exit 1, naming who, and nothing is
deleted. A NAME with nothing under it is no error.`,
		`# a semaphore used once, years ago: make the name free for a lock
etcdsync delete jobs
etcdsync lock jobs -- ./nightly.sh`)
	fs := sub.flags
	fs.StringVar(&c.prefix, "prefix", "", "the names' keys are under this `prefix` (ends with '/')")
	fs.BoolVar(&c.etcd, "etcd-layout", false, "the names' keys are where etcd's own primitives put them (see lock)")
	c.conn.register(fs)
	return sub
}

func (c *deleteCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	switch {
	case err != nil:
		return err
	case len(names) == 0:
		return usagef("NAME missing")
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	}
	c.names = names
	return validNames(names)
}

// run deletes the names' records, or says who holds or waits.
func (c *deleteCommand) run(a *app) (int, error) {
	cli, ctx, done, err := c.conn.request()
	if err != nil {
		return 0, err
	}
	defer done()
	opts := []admin.Option{admin.Prefix(c.prefix)}
	if c.etcd {
		opts = append(opts, admin.EtcdLayout())
	}
	err = admin.Delete(ctx, cli, c.names, opts...)
	switch {
	case errors.Is(err, admin.ErrInUse):
		a.errorf("%v: nothing deleted", err)
		return exitFree, nil
	case errors.Is(err, core.ErrInvalidOption), errors.Is(err, core.ErrInvalidName):
		return 0, usagef("%v", err)
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	return exitOK, nil
}
