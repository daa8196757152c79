//go:build unix

package main

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/etcdsync/etcdsync/once"
)

// onceTerm runs once's command under h, the job's lock: it asks whether the period is due,
// runs the command if it is, records the period done when the command exits 0, and
// releases. A period done already is exit 0 without the command.
func (c *holdCommand) onceTerm(a *app, h hold, sigc <-chan os.Signal) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	p, due, err := c.job.Due(ctx)
	cancel()
	if err != nil || !due {
		if rerr := c.release(a, h); rerr != nil {
			a.warnf("%v", rerr)
		}
		if err != nil {
			return 0, fail(exitEtcd, err)
		}
		a.logf("%s: the period of %s is done already: not run", c.what(), p.Start.Format(time.RFC3339))
		return exitOK, nil
	}
	c.period = p.Start
	var maxHeld <-chan time.Time
	if c.maxHold > 0 {
		t := time.NewTimer(c.maxHold)
		defer t.Stop()
		maxHeld = t.C
	}
	code, err := c.runCommand(a, h, sigc, maxHeld)
	if err == nil && code == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
		cerr := c.job.Complete(ctx, p)
		cancel()
		switch {
		case errors.Is(cerr, once.ErrLost):
			err = failf(exitLost, "%s lost before the period of %s was recorded done: it may run again: %v",
				c.what(), p.Start.Format(time.RFC3339), cerr)
		case cerr != nil:
			err = failf(exitEtcd, "the period of %s was not recorded done: it may run again: %v", p.Start.Format(time.RFC3339), cerr)
		default:
			a.logf("%s: the period of %s recorded done", c.what(), p.Start.Format(time.RFC3339))
		}
	}
	if rerr := c.release(a, h); rerr != nil && err == nil {
		a.warnf("%v", rerr)
	}
	return code, err
}
