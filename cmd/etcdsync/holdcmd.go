//go:build unix

package main

import (
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/once"
)

// The help of the hold commands: what each does, and an example.
var holdHelp = map[string]struct{ about, example string }{
	"lock": {
		`Runs CMD while holding the lock NAME: one holder at a time across every host, served
first come, first served. Exits with CMD's status. CMD follows NAME, as with etcdctl
lock NAME CMD ARGS..., or a "--" after it (NAME -- CMD ARGS...). Without CMD, holds the
lock until interrupted and prints its name, key and fencing token. On a name without
'/' and '%', etcdctl lock, Go's etcdsync/mutex and etcd's concurrency.Mutex exclude it
too.

With several names (up to 64), it holds all of them at once or none, as Go's
etcdsync/mutex Multi: one key per name, all written together with one token, so that
two commands that share names never deadlock, whatever order they list them in. Several
names need a "--" after the last one (lock a b -- CMD): without it, what follows the
first name is the command. ETCDSYNC_NAME and ETCDSYNC_KEY then list the names and keys
one per line.`,
		`# the nightly report runs on one host at a time; the others wait their turn
etcdsync lock nightly-report /usr/local/bin/report --all
# skip this run if another host has it (exit 75), like flock -n
etcdsync lock --try nightly-report -- /usr/local/bin/report
# move stock between two warehouses while no other job touches either
etcdsync lock stock/berlin stock/paris -- ./transfer --from berlin --to paris`,
	},
	"rlock": {
		`Runs CMD while holding a read lock of NAME: many readers at once, but never while a
writer (Go's etcdsync/rwmutex Lock on NAME) holds it; a reader that comes after a
waiting writer waits behind it. CMD follows NAME, or a "--" after it, as lock's does.
ETCDSYNC_TOKEN is the create revision of the read key.`,
		`# back up the configuration while no writer changes it
etcdsync rlock pricing-config -- etcdctl get --prefix pricing/ -w json`,
	},
	"sem": {
		`Runs CMD while holding one of N permits of NAME (K of them with --units K, all at once
or none): at most N commands at once across every host (N units), served first come,
first served; a command waiting for K units is not overtaken by smaller ones behind it.
CMD follows NAME, or a "--" after it, as lock's does.

etcd records N at the name's first use, and from then on its record is the limit,
whatever N later users give: a -n that differs from it runs under etcd's limit, with a
warning on stderr that names both and the --set-limit that would change it (exit 64 for
--units above it). --set-limit N changes it while commands hold and wait, and exits: a
raise starts the waiters that now fit at once; after a lowering, those that run go on
and nobody new starts until the units in use fit.`,
		`# at most 4 thumbnailers at once, on however many hosts
etcdsync sem -n 4 thumbnailers -- ./make-thumbnails --batch 100
# a training job that needs 4 of the 16 GPUs of the pool
etcdsync sem -n 16 --units 4 gpus -- ./train --gpus 4
# the pool grew: 24 GPUs from now on, for the jobs running and waiting too
etcdsync sem --set-limit 24 gpus`,
	},
	"once": {
		`Runs CMD at most once per period D (--every) across every host that runs it: cron on
every host, one run a period. It takes the lock NAME, as lock does, and under it reads
the record of the last period done: if the period the local clock is in is done, it
releases and exits 0 without running CMD; else it runs CMD, and if CMD exits 0 records
the period done, fenced by the hold, before it releases. A CMD that fails records
nothing, so the next host's once in the period runs it again. Periods count from the
Unix epoch (--every 24h: every day from midnight UTC); the record only moves forward,
so a host whose clock lags never runs a period again. ETCDSYNC_PERIOD is the start of
the period CMD runs for (RFC 3339, UTC). Go's etcdsync/once Job of the same NAME and
period shares the record.`,
		`# in every host's crontab: the report runs once a day, on the first host
0 2 * * * etcdsync once --every 24h nightly-report -- ./report --all
# hourly; exit 75 at once while another host runs it
5 * * * * etcdsync once --every 1h --try rotate-keys -- ./rotate`,
	},
	"elect": {
		`Runs CMD once this candidate leads the election NAME: one leader at a time; the
others wait in line and the next takes over when the leader's CMD exits or its hold is
lost. PROPOSAL, as etcdctl elect NAME PROPOSAL takes it, or --value V, is the
candidate's value: what observers, status and transfer --to see of it. CMD comes only
after "--". Without CMD, it campaigns, prints the leader's key and value, a line each,
once it leads (as etcdctl elect does), and leads until interrupted. On a name without
'/' and '%', etcdctl elect and etcd's concurrency.Election see the same leader.

With --loop, a candidate whose leadership was lost (CMD stopped, as with exit 125), or
whose CMD exited 0, campaigns again and runs CMD again when it leads, until interrupted:
a daemon that must always have one active copy. Any other exit of CMD ends the loop
with its status. When etcdsync transfer asks the leader to hand over, or a candidate of
a higher --prefer has waited --settle, the leader stops CMD as on a loss, hands the
leadership over once CMD's group is gone, and exits 0 (with --loop, campaigns again).`,
		`# one active billing worker; a standby takes over when it stops
etcdsync elect billing-leader "$(hostname):8080" -- ./billing-worker
# the same, and a replica whose worker lost the leadership stands again
etcdsync elect --loop billing-leader -- ./billing-worker
# the new version is preferred: it takes over once it has waited 30s
etcdsync elect --loop --prefer 2 --settle 30s billing-leader -- ./worker-v2`,
	},
}

// define registers the flags of the hold command.
func (c *holdCommand) define() *subcommand {
	h := holdHelp[c.verb]
	sub := newSubcommand(c.verb, h.about, h.example)
	fs := sub.flags
	if c.verb == "sem" {
		fs.IntVar(&c.limit, "n", 0, "how many (`N`) may hold at once, recorded at the name's first use; etcd's record is the limit from then on, and another N is a warning (required, but with --set-limit)")
		fs.IntVar(&c.units, "units", 1, "how many (`K`) of the limit this command takes, from 1 to the limit")
		fs.IntVar(&c.setLimit, "set-limit", 0, "change the limit of NAME to `N` for every user, and exit (no command)")
	}
	if c.verb == "once" {
		fs.DurationVar(&c.every, "every", 0, "the period `D`, 1s or more: CMD runs at most once in each, counted from the Unix epoch (required)")
	}
	if c.verb == "elect" {
		fs.StringVar(&c.value, "value", "", "the candidate's value `V`, what observers see of the leader, as PROPOSAL (default \"host=HOST pid=PID since=TIME role=candidate\")")
		fs.BoolVar(&c.loop, "loop", false, "after a loss, a transfer, or after CMD exits 0, campaign again and run CMD again, until interrupted")
		fs.IntVar(&c.prefer, "prefer", 0, "this candidate's preference `N`, 0 to 1000000: a leader of a lower one hands over to it once it has waited --settle")
		fs.DurationVar(&c.settle, "settle", 0, "how long a more preferred candidate waits, and a leader leads, before a leader hands over for preference (default 10s)")
	}
	fs.DurationVar(&c.ttl, "ttl", mutex.DefaultTTL, "lease TTL: how long others wait for this hold if etcdsync dies or loses etcd")
	fs.StringVar(&c.prefix, "prefix", "", "put the name's keys under this `prefix`, which ends with '/'")
	fs.BoolVar(&c.etcdLayout, "etcd-layout", false, "put the name's keys where etcd's own primitives (etcdctl lock and elect, concurrency.Mutex) put them for a NAME with '/', not escaped")
	fs.DurationVar(&c.timeout, "timeout", 0, "give up waiting after this long (exit 124); 0 waits forever")
	if c.verb == "lock" {
		fs.BoolVar(&c.detach, "detach", false, "take the lock, print its ticket and exit, leaving the hold for its TTL (see renew, release --ticket)")
	}
	fs.DurationVar(&c.maxHold, "max-hold", 0, "end the hold after this long even if the command still runs: its process group is stopped (SIGTERM, SIGKILL after --grace), and the hold released once the group is gone (exit 123); 0 for no bound")
	if c.verb != "elect" {
		fs.BoolVar(&c.yieldOnAsk, "yield-on-ask", false, "when the hold is asked to let go (etcdsync ask), stop the command's process group (SIGTERM, SIGKILL after --grace) and release once it is gone; exit with the command's status (without CMD: release, exit 0)")
	}
	fs.DurationVar(&c.lockDelay, "lock-delay", 0, "when the holder before this one did not release (its lease ended: it crashed or was cut off), wait this much more, up to 60s")
	if c.verb == "elect" {
		fs.BoolVar(&c.try, "try", false, "") // not in the help: refused with a message of its own
	} else {
		fs.BoolVar(&c.try, "try", false, "one try: exit 75 at once if the name is busy, having written nothing")
	}
	fs.DurationVar(&c.grace, "grace", 10*time.Second, "after SIGTERM to the command's process group (on a loss, --max-hold, or passed on from etcdsync's first SIGINT, SIGTERM or SIGHUP), SIGKILL after this long; a second signal sends it at once")
	fs.IntVar(&c.commandFailed, "command-failed", 0, "exit `N` whenever the command exits non-zero or dies of a signal, so that its status never reads as one of etcdsync's own; N from 1 to 122 but 64, 69, 75")
	fs.BoolVar(&c.shell, "shell", false, "run CMD ARGS... joined by spaces with /bin/sh -c")
	fs.BoolVar(&c.verbose, "verbose", false, "log every step to stderr, with times")
	c.conn.register(fs)
	return sub
}

// parse reads NAME, the command after it, the flags and ETCDCTL_* variables, and checks
// what can be checked without etcd.
func (c *holdCommand) parse(sub *subcommand, args []string, a *app) error {
	operands, rest, err := sub.commandLine(args, c.verb == "elect")
	if err != nil {
		return err
	}

	if err := applyEnv(sub.flags, a.getenv); err != nil {
		return err
	}
	a.verbose = c.verbose
	set := setFlags(sub.flags)
	if c.verb == "elect" {
		switch {
		case len(operands) > 2:
			return usagef("%d operands before the command: elect takes NAME [PROPOSAL], and CMD only after \"--\" (elect NAME [PROPOSAL] -- CMD)", len(operands))
		case len(operands) == 2 && set["value"]:
			return usagef("the candidate's value twice: --value and PROPOSAL %q; give one", operands[1])
		case len(operands) == 2:
			c.value, operands = operands[1], operands[:1]
			set["value"] = true
		}
	}
	switch {
	case len(operands) == 0:
		return usagef("NAME missing (etcdsync %s --help)", c.verb)
	case c.verb != "lock" && len(operands) > 1:
		return usagef("%d names before \"--\": %s takes one NAME (only lock takes several)", len(operands), c.verb)
	case set["set-limit"] && c.setLimit < 1:
		return usagef("--set-limit %d: 1 or more", c.setLimit)
	case set["set-limit"] && (len(rest) > 0 || len(operands) > 1):
		return usagef("--set-limit changes the limit of one NAME and runs no command")
	case set["set-limit"]:
		for _, f := range []string{"n", "units", "try", "timeout", "max-hold", "lock-delay", "command-failed", "shell"} {
			if set[f] {
				return usagef("--set-limit takes no --%s: it holds nothing", f)
			}
		}
	case c.verb == "once" && !set["every"]:
		return usagef("--every D missing: the period in which CMD runs at most once")
	case c.verb == "once" && c.every < once.MinPeriod:
		return usagef("--every %v: %v or more", c.every, once.MinPeriod)
	case c.verb == "once" && len(rest) == 0:
		return usagef("CMD missing: once runs a command at most once per period")
	case c.verb == "sem" && !set["n"]:
		return usagef("-n N missing: how many may hold at once")
	case c.verb == "sem" && c.limit >= 1 && (c.units < 1 || c.units > c.limit):
		return usagef("--units %d: from 1 to -n %d", c.units, c.limit)
	case c.timeout < 0:
		return usagef("--timeout %v is negative", c.timeout)
	case c.grace < 0:
		return usagef("--grace %v is negative", c.grace)
	case set["command-failed"] && !freeStatus(c.commandFailed):
		return usagef("--command-failed %d: from 1 to 122, but not 64, 69 or 75, which are etcdsync's own", c.commandFailed)
	case set["command-failed"] && len(rest) == 0:
		return usagef("--command-failed without a command")
	case c.try && set["timeout"]:
		return usagef("--try and --timeout exclude each other: --try does not wait at all")
	case c.try && c.verb == "elect":
		return usagef("--try: an election has no try; use --timeout")
	case c.shell && len(rest) == 0:
		return usagef("--shell without a command")
	case c.loop && len(rest) == 0:
		return usagef("--loop without a command")
	case c.detach && (len(rest) > 0 || len(operands) > 1):
		return usagef("--detach holds one NAME and runs no command: it prints a ticket and exits")
	case c.detach && c.maxHold != 0:
		return usagef("--max-hold does not bound a detached hold: its --ttl does, unless renewed")
	case c.detach && c.yieldOnAsk:
		return usagef("--yield-on-ask: a detached hold has nobody to heed an ask")
	}
	for _, name := range operands {
		if err := core.ValidateName(name); err != nil {
			return usagef("%v", err)
		}
		if err := refuseLineBreaks(name, "name"); err != nil {
			return err
		}
	}
	if err := refuseLineBreaks(c.prefix, "--prefix"); err != nil {
		return err
	}
	c.names = slices.Compact(slices.Sorted(slices.Values(operands)))
	if len(c.names) > mutex.MaxNames {
		return usagef("%d names: at most %d at once", len(c.names), mutex.MaxNames)
	}
	c.name = c.names[0]
	if len(rest) > 0 {
		c.command = rest
	}
	if c.verb == "elect" && !set["value"] {
		c.value = core.OwnerValue(candidateField) // an owner, marked as a candidate's for status
	}
	return nil
}

// refuseLineBreaks refuses a name or a --prefix (what) with a character that breaks lines (see
// breaksLines): ETCDSYNC_NAME and ETCDSYNC_KEY list the names and keys of a hold one per
// line, and a fence compares each line with a key, so a name that spans lines would make
// them ambiguous. Such a name is refused rather than escaped, since an escaped name would
// not be the key's name. The library takes such names; status shows them quoted.
func refuseLineBreaks(s, what string) error {
	i := strings.IndexFunc(s, breaksLines)
	if i < 0 {
		return nil
	}
	r, _ := utf8.DecodeRuneInString(s[i:])
	return usagef("invalid %s %q: it holds %U, a control character or line separator, and the command lists names and keys one per line (ETCDSYNC_NAME, ETCDSYNC_KEY)", what, s, r)
}
