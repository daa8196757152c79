//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
)

// transferCommand is `etcdsync transfer`, parsed.
type transferCommand struct {
	name    string
	to      string // --to: the candidate's value; "" to step down
	toSet   bool
	prefix  string
	timeout time.Duration
	conn    connection
}

func (c *transferCommand) define() *subcommand {
	sub := newSubcommand("transfer",
		`Asks the leader of the election NAME to hand its leadership to the candidate whose value
is VALUE (--to), ahead of the candidates before it, which keep their order; without
--to, to step down (the next in line leads). Once the candidate has answered that it
takes over, the leader (etcdsync elect, or a Go program that leads by Run) stops its
work, as on a loss, then hands over; the token passes with the leader's key. Prints the
leader after, as "VALUE token T". Exit 1 if nobody leads, or no candidate of etcdsync
has that value, or it did not answer within 5s (its process is gone: nothing changed),
or did not take over (the leader leads on); 75 if another transfer is asked already; 124
if the leader did not answer within --timeout (it leads by Campaign, which answers no
request): the request is then withdrawn.`,
		`# hand over to the new version's replica, once the leader's work stopped
etcdsync transfer billing-leader --to "web-7:8080"
# the leader steps down; with --loop, it stands again, behind the others
etcdsync transfer billing-leader`)
	fs := sub.flags
	fs.Func("to", "the `VALUE` of the candidate to hand the leadership to (etcdsync status shows them); without it, the leader steps down", func(v string) error {
		c.to, c.toSet = v, true
		return nil
	})
	fs.StringVar(&c.prefix, "prefix", "", "the name's keys are under this `prefix` (ends with '/')")
	fs.DurationVar(&c.timeout, "timeout", time.Minute, "give up when the leader has not answered after this long (exit 124)")
	c.conn.register(fs)
	return sub
}

func (c *transferCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	switch {
	case err != nil:
		return err
	case len(names) != 1:
		return usagef("one NAME, the election's, expected; got %d", len(names))
	case c.toSet && c.to == "":
		return usagef("--to needs a VALUE: without --to, the leader steps down")
	case c.prefix != "" && !strings.HasSuffix(c.prefix, "/"):
		return usagef("--prefix %q does not end with '/'", c.prefix)
	case c.timeout <= 0:
		return usagef("--timeout %v is not positive", c.timeout)
	}
	c.name = names[0]
	return validNames(names)
}

// run asks for the transfer and waits for the leader's answer.
func (c *transferCommand) run(a *app) (int, error) {
	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	if err := c.conn.probe(cli, c.prefix+core.NamePrefix(c.name)); err != nil {
		return 0, err
	}
	var opts []election.Option
	if c.prefix != "" {
		opts = append(opts, election.WithPrefix(c.prefix))
	}
	e, err := election.New(cli, c.name, opts...)
	if err != nil {
		return 0, usagef("%v", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
		defer cancel()
		_ = election.Shutdown(ctx, cli) // the request's lease: nothing of this process stays
	}()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	l, err := e.RequestTransfer(ctx, c.to)
	switch {
	case errors.Is(err, election.ErrNoLeader):
		a.errorf("election %q: nobody leads: nothing changed", c.name)
		return exitFree, nil
	case errors.Is(err, election.ErrNoCandidate):
		a.errorf("%v", err) // it says who leads now
		return exitFree, nil
	case errors.Is(err, core.ErrTransferAsked):
		return 0, failf(exitBusy, "election %q: %v", c.name, err)
	case errors.Is(err, context.DeadlineExceeded):
		return 0, failf(exitTimeout, "election %q: the leader did not answer within --timeout %v (it leads by Campaign, or its work did not stop): the request was withdrawn", c.name, c.timeout)
	case err != nil:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	if l.Token == 0 {
		fmt.Fprintln(a.stdout, "nobody leads")
		return exitOK, nil
	}
	fmt.Fprintf(a.stdout, "%s token %d\n", l.Value, l.Token)
	return exitOK, nil
}
