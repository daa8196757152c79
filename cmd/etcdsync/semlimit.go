//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/semaphore"
)

// checkLimit reads the limit etcd records for the semaphore, and warns when it is another
// than -n: etcd's record is the limit, and a -n that differs from it would otherwise change
// nothing, silently. --units above the record is a usage error, before any key is written.
// One read, within --command-timeout; a failed read is only logged: the wait reads the
// limit too, and fails on its own if etcd does.
func (c *holdCommand) checkLimit(a *app, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	recorded, err := core.ReadLimit(ctx, cli, c.keyPrefix())
	switch {
	case err != nil:
		a.logf("%s: the limit etcd records not read: %v", c.what(), err)
	case recorded == 0 || recorded == c.limit:
	case c.units > recorded:
		return usagef("--units %d: over the limit of %d that etcd records for %s (not -n %d: etcd's record is the limit; --set-limit changes it)",
			c.units, recorded, c.what(), c.limit)
	default:
		change := fmt.Sprintf("etcdsync sem --set-limit %d %s", c.limit, shellQuote(c.name))
		if c.prefix != "" {
			change = fmt.Sprintf("etcdsync sem --set-limit %d --prefix %s %s", c.limit, shellQuote(c.prefix), shellQuote(c.name))
		}
		a.warnf("%s: etcd records a limit of %d, not -n %d: it runs under %d (to change it for every user: %s)",
			c.what(), recorded, c.limit, recorded, change)
	}
	return nil
}

// changeLimit is `sem --set-limit N NAME`: the limit changed for every user, within
// --command-timeout.
func (c *holdCommand) changeLimit(a *app) (int, error) {
	cli, ctx, done, err := c.conn.request()
	if err != nil {
		return 0, err
	}
	defer done()
	opts := []semaphore.Option{semaphore.WithTTL(c.ttl)}
	if c.prefix != "" {
		opts = append(opts, semaphore.WithPrefix(c.prefix))
	}
	s, err := semaphore.New(cli, c.name, c.setLimit, opts...)
	if err != nil {
		return 0, usagef("%v", err)
	}
	switch err := s.SetLimit(ctx, c.setLimit); {
	case errors.Is(err, core.ErrOtherKind):
		return 0, fail(exitUsage, err)
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	a.logf("%s: limit set to %d", c.what(), c.setLimit)
	return exitOK, nil
}
