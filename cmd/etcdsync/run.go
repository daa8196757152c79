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

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/once"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// holdCommand is lock, rlock, sem or elect, parsed.
type holdCommand struct {
	verb    string   // lock, rlock, sem, elect, once
	name    string   // the name to hold; with several (lock), the first of names
	names   []string // lock: every name to hold at once, sorted, without duplicates
	command []string // what to run; nil to hold until interrupted

	conn   connection
	ttl    time.Duration
	prefix string
	// etcdLayout: --etcd-layout, the name's keys unescaped, where etcd's primitives put them.
	etcdLayout bool
	timeout    time.Duration
	grace      time.Duration
	try        bool
	shell      bool
	verbose    bool
	limit      int           // sem -n
	units      int           // sem --units
	setLimit   int           // sem --set-limit
	value      string        // elect --value
	loop       bool          // elect --loop
	prefer     int           // elect --prefer
	settle     time.Duration // elect --settle
	every      time.Duration // once --every
	job        *once.Job     // once: the job, whose Mutex is the lock held
	period     time.Time     // once: the start of the period the command runs for

	commandFailed int           // --command-failed: the status for every non-zero status of the command; 0 to pass it on
	maxHold       time.Duration // --max-hold: 0 for none
	lockDelay     time.Duration // --lock-delay
	detach        bool          // lock --detach: print a ticket and leave the hold for its TTL
	yieldOnAsk    bool          // --yield-on-ask: etcdsync ask stops the command and releases

	stopSignal os.Signal // the first signal that asked the command to stop: never loop again
	yielded    bool      // the last term's command was stopped (or the hold let go) for a handover
}

// what names the thing held, for messages: `lock "nightly"`.
func (c *holdCommand) what() string {
	noun := map[string]string{"lock": "lock", "rlock": "read lock", "sem": "semaphore", "elect": "election", "barrier": "barrier", "once": "once job"}[c.verb]
	if len(c.names) > 1 {
		return fmt.Sprintf("locks %q", c.names)
	}
	return fmt.Sprintf("%s %q", noun, c.name)
}

// nameVar is ETCDSYNC_NAME: the name, or the names held at once, one per line.
func (c *holdCommand) nameVar() string {
	if len(c.names) > 1 {
		return strings.Join(c.names, "\n")
	}
	return c.name
}

// keyPrefix is where the name's keys live (the first name's, with several).
func (c *holdCommand) keyPrefix() string { return keyPrefix(c.prefix, c.name, c.etcdLayout) }

// keyPrefix is where the keys of name are, under prefix, escaped or (etcd) not.
func keyPrefix(prefix, name string, etcd bool) string {
	if etcd {
		return prefix + name + "/"
	}
	return prefix + core.NamePrefix(name)
}

// acquirer makes the primitive; its constructor validates the name and options, with no I/O.
func (c *holdCommand) acquirer(cli *clientv3.Client) (acquirer, error) {
	// The options of every package are interchangeable.
	opts := []mutex.Option{mutex.WithTTL(c.ttl)}
	if c.prefix != "" {
		opts = append(opts, mutex.WithPrefix(c.prefix))
	}
	if c.lockDelay != 0 {
		opts = append(opts, mutex.WithLockDelay(c.lockDelay))
	}
	if c.etcdLayout {
		opts = append(opts, mutex.WithEtcdLayout())
	}
	var a acquirer
	var err error
	switch {
	case c.verb == "lock" && len(c.names) > 1:
		var m *mutex.Multi
		m, err = mutex.NewMulti(cli, c.names, opts...)
		a = multiLock{m}
	case c.verb == "once":
		c.job, err = once.New(cli, c.name, c.every, opts...)
		a = lock{c.job.Mutex()}
	case c.verb == "lock":
		var m *mutex.Mutex
		m, err = mutex.New(cli, c.name, opts...)
		a = lock{m}
	case c.verb == "rlock":
		var rw *rwmutex.RWMutex
		rw, err = rwmutex.New(cli, c.name, opts...)
		a = readLock{rw: rw, cli: cli, timeout: c.conn.commandTimeout}
	case c.verb == "sem":
		var s *semaphore.Semaphore
		s, err = semaphore.New(cli, c.name, c.limit, opts...)
		a = permits{s: s, units: c.units}
	case c.verb == "elect":
		if c.prefer != 0 {
			opts = append(opts, election.WithPreference(c.prefer))
		}
		if c.settle != 0 {
			opts = append(opts, election.WithSettle(c.settle))
		}
		var e *election.Election
		e, err = election.New(cli, c.name, opts...)
		a = candidate{e: e, value: c.value}
	}
	if err != nil {
		return nil, usagef("%v", err)
	}
	return a, nil
}

// run acquires, runs the command (or waits for a signal), releases, and returns the exit
// status: the command's, or one of etcdsync's own with the error that says why.
func (c *holdCommand) run(a *app) (int, error) {
	if c.setLimit > 0 {
		return c.changeLimit(a)
	}
	// From here on a signal is ours to handle: it cancels the wait, or goes to the command.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)

	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	defer c.shutdown(a, cli)
	acq, err := c.acquirer(cli)
	if err != nil {
		return 0, err
	}
	if err := c.conn.probe(cli, c.keyPrefix()); err != nil {
		return 0, err
	}
	if c.verb == "sem" {
		if err := c.checkLimit(a, cli); err != nil {
			return 0, err
		}
	}
	var kept hold // a leadership whose handover failed after its command stopped: it leads on
	for {
		h := kept
		if h == nil {
			var err error
			if h, err = c.acquire(a, acq, sigc); err != nil {
				return 0, err
			}
		}
		if c.detach {
			return c.detachHold(a, h)
		}
		if c.verb == "once" {
			return c.onceTerm(a, h, sigc)
		}
		code, leadsOn, err := c.term(a, h, sigc, kept == nil)
		if kept = nil; leadsOn {
			kept = h
			continue
		}
		if !c.again(a, code, err) {
			return code, err
		}
	}
}

// term holds h until the command's group is gone (or, without a command, until a signal),
// then releases it; --max-hold ends it by the command's own timer, which stops the group
// first: the hold, and so the key, outlasts every process of the group, and the next
// holder's command never starts beside this one. The library's WithMaxHold would delete the
// key at the maximum while the group still runs; a backstop of it would run in this same
// process, so it would fail whenever this timer does, and once etcdsync is gone the lease
// (--ttl) bounds the key anyway.
//
// leadsOn reports a leadership whose handover failed once its command had stopped for it
// (the candidate withdrew after it answered): it is kept, and its command runs again. The
// hold is printed (without a command) only if print.
func (c *holdCommand) term(a *app, h hold, sigc <-chan os.Signal, print bool) (code int, leadsOn bool, err error) {
	var maxHeld <-chan time.Time
	if c.maxHold > 0 {
		t := time.NewTimer(c.maxHold)
		defer t.Stop()
		maxHeld = t.C
	}
	c.yielded = false
	if c.command == nil {
		code, err = c.holdUntilSignalled(a, h, sigc, maxHeld, print)
	} else {
		code, err = c.runCommand(a, h, sigc, maxHeld)
	}
	rerr := c.release(a, h)
	switch {
	case c.yielded && errors.Is(rerr, errLeadsOn) && err == nil && c.stopSignal == nil:
		a.warnf("%s: %v; it leads on, and runs the command again", c.what(), rerr)
		return code, true, nil
	case rerr != nil && err == nil:
		a.warnf("%v", rerr)
	}
	return code, false, err
}

// again reports whether elect --loop campaigns again after a term that ended with code and
// err: after a loss, or a command that exited 0, unless a signal was passed on to it.
func (c *holdCommand) again(a *app, code int, err error) bool {
	switch {
	case !c.loop || c.stopSignal != nil:
		return false
	case err != nil && (exitCode(err) == exitLost || exitCode(err) == exitMaxHold):
		a.warnf("%v; campaigning again (--loop)", err)
		return true
	case err == nil && code == 0:
		a.logf("%s: campaigning again after the command exited 0 (--loop)", c.what())
		return true
	}
	return false
}

// acquire waits for the hold (or tries once) until --timeout or a signal. A wait cut short
// leaves no key: the primitives delete their key before they return.
func (c *holdCommand) acquire(a *app, acq acquirer, sigc <-chan os.Signal) (hold, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	type result struct {
		h   hold
		err error
	}
	resc := make(chan result, 1)
	start := time.Now()
	a.logf("%s: waiting (ttl %v)", c.what(), c.ttl)
	go func() {
		var r result
		if c.try {
			r.h, r.err = acq.try(ctx)
		} else {
			r.h, r.err = c.waitThroughOutages(ctx, a, acq)
		}
		resc <- r
	}()
	var r result
	select {
	case r = <-resc:
	case sig := <-sigc:
		cancel()
		if r = <-resc; r.err == nil {
			_ = c.release(a, r.h)
		}
		return nil, failf(exitSignal+signum(sig), "%s while waiting for %s", signame(sig), c.what())
	}
	switch err := r.err; {
	case err == nil:
	case errors.Is(err, errBusy):
		return nil, failf(exitBusy, "%s is busy", c.what())
	case c.timeout > 0 && errors.Is(err, context.DeadlineExceeded):
		return nil, failf(exitTimeout, "%s not acquired within %v", c.what(), c.timeout)
	case errors.Is(err, semaphore.ErrLimitMismatch), c.verb == "sem" && errors.Is(err, semaphore.ErrInvalidOption):
		return nil, usagef("--units %d: %v", c.units, err)
	case errors.Is(err, core.ErrOtherKind):
		return nil, fail(exitUsage, err) // another kind's name: nothing was written
	case errors.Is(err, core.ErrReleasedByOperator):
		return nil, failf(exitLost, "the wait for %s was ended: %s", c.what(), lossCause(err))
	default:
		return nil, fail(exitEtcd, err)
	}
	h := r.h
	h.Done() // watch the hold from now on, so that a loss is known at once
	a.logf("%s: acquired after %v: key %s, token %d", c.what(), time.Since(start).Round(time.Millisecond), h.Key(), h.Token())
	return h, nil
}

// requeuePause is how long a wait whose place in line was lost pauses before it takes a new
// one, so that an outage that keeps ending sessions is not met with a busy loop.
const requeuePause = 500 * time.Millisecond

// waitThroughOutages waits in line; when the place in line is lost (an outage let the
// session's lease run out, someone deleted the key or revoked the lease), it takes a new
// place once etcd answers again, until ctx ends (--timeout, or a signal), instead of
// failing: the caller asked to wait, and nothing was held yet. An operator's release of the
// wait (etcdsync release) ends it: exit 125. Endpoints of different
// clusters are no outage: no new place in line can help (exit 69).
func (c *holdCommand) waitThroughOutages(ctx context.Context, a *app, acq acquirer) (hold, error) {
	for {
		h, err := acq.acquire(ctx)
		switch {
		case errors.Is(err, core.ErrReleasedByOperator):
			return nil, err // an operator took this place in line away: waiting again would undo that
		case err == nil || !errors.Is(err, mutex.ErrLost) || errors.Is(err, core.ErrMixedClusters) || ctx.Err() != nil:
			return h, err
		}
		a.logf("%s: place in line lost (%v); waiting again once etcd answers", c.what(), err)
		t := time.NewTimer(requeuePause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// detachHold lets go of h without releasing it and prints its ticket (lock --detach).
func (c *holdCommand) detachHold(a *app, h hold) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	key, token := h.Key(), h.Token()
	ticket, err := h.(lockHold).Detach(ctx)
	if err != nil {
		if rerr := c.release(a, h); rerr != nil {
			a.warnf("%v", rerr)
		}
		return 0, fail(exitEtcd, err)
	}
	a.logf("%s: detached: key %s, token %d", c.what(), key, token)
	fmt.Fprintln(a.stdout, ticket)
	return exitOK, nil
}

// holdUntilSignalled prints the hold (if print: not again for a leadership that leads on)
// and holds until a signal (exit 0) or a loss. It prints the name, the key and the token
// as shell variables; elect prints the leader's key and value, one line each, as etcdctl
// elect does.
func (c *holdCommand) holdUntilSignalled(a *app, h hold, sigc <-chan os.Signal, maxHeld <-chan time.Time, print bool) (int, error) {
	switch {
	case !print:
	case c.verb == "elect":
		fmt.Fprintf(a.stdout, "%s\n%s\n", h.Key(), c.value)
	default:
		fmt.Fprintf(a.stdout, "ETCDSYNC_NAME=%s\nETCDSYNC_KEY=%s\nETCDSYNC_TOKEN=%d\n", shellQuote(c.nameVar()), shellQuote(h.Key()), h.Token())
	}
	select {
	case <-h.Done():
		a.logf("%s: lost: %s", c.what(), lossCause(h.Err()))
		return 0, failf(exitLost, "%s lost: %s", c.what(), lossCause(h.Err()))
	case <-maxHeld:
		a.logf("%s: --max-hold %v passed: releasing", c.what(), c.maxHold)
		return 0, failf(exitMaxHold, "%s held for --max-hold %v: released", c.what(), c.maxHold)
	case sig := <-sigc:
		a.logf("%s: releasing on %s", c.what(), signame(sig))
		return exitOK, nil
	case <-c.askedOf(h):
		if c.verb != "elect" {
			a.logf("%s: asked to let go (etcdsync ask): releasing", c.what())
			return exitOK, nil
		}
		a.logf("%s: asked to hand the leadership over", c.what())
		c.yielded = true
		return exitOK, nil
	}
}

// release ends the hold within --command-timeout. It returns why it failed, if it did; a
// loss reported here was reported before, or came after the command ended.
func (c *holdCommand) release(a *app, h hold) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	err := h.release(ctx)
	switch {
	case err == nil:
		a.logf("%s: released", c.what())
		return nil
	case errors.Is(err, errLeadsOn):
		return err
	case errors.Is(err, mutex.ErrLost):
		return fmt.Errorf("%s was lost as it was released: %s", c.what(), lossCause(err))
	default:
		return fmt.Errorf("%s not released (its key goes when its lease expires, within %v): %w", c.what(), c.ttl, err)
	}
}

// shutdown revokes the client's lease, within --command-timeout, so that nothing of this
// process stays in etcd: no key, also of a wait that failed, and no lease.
func (c *holdCommand) shutdown(a *app, cli *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	if err := mutex.Shutdown(ctx, cli); err != nil {
		a.logf("%s: lease not revoked (it expires in %v): %v", c.what(), c.ttl, err)
	}
}

// shellQuote quotes s for a POSIX shell, unless it needs no quotes.
func shellQuote(s string) string {
	safe := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:%@+=,", r))
	}) < 0
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
