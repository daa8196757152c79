//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/etcdsync/etcdsync/admin"
)

// statusCommand is `etcdsync status`, parsed.
type statusCommand struct {
	names    []string
	prefix   string
	etcd     bool // --etcd-layout
	json     bool
	writeOut string // -w, --write-out: json, simple, or "" when not given
	watch    bool
	check    bool   // exit 0 if every name is held, exitFree if one is free
	kind     string // what the keys directly under a name are: lock, election, or "" to tell by their values
	conn     connection
}

func (c *statusCommand) define() *subcommand {
	sub := newSubcommand("status",
		`Shows what each NAME is (lock, rwmutex, semaphore, election, barrier, latch), and every
holder and waiter of it, in the order they are served: position, kind (lock, read,
write, permit, permit(K) for K units, candidate, participant), state (holds, leads,
entered, waits), key, token (the key's create revision), lease and the TTL it has
left, and its owner (host, pid and since when) if the key's value names one, else
"unknown". An election shows its leader's value, and each candidate's value instead of
an owner: what etcdctl elect prints, what transfer --to names. Works on the names of
every etcdsync primitive and of etcd's own concurrency.Mutex, Election and etcdctl.

The keys of a lock and of an election look alike: a name is an election when one of
its keys has a value that no lock writes (a lock writes nothing, or its owner); --kind
says which instead. Without NAME, shows every name under --prefix, or at the root of
the keyspace, where names go by default (a name under a prefix is shown with --prefix).`,
		`# who runs the nightly report, and who waits for it
etcdsync status nightly-report
# every name at the root of the keyspace, etcdctl's too
etcdsync status
# every name under app/, for a script, and again at every change
etcdsync status --prefix app/ -w json --watch`)
	fs := sub.flags
	fs.StringVar(&c.prefix, "prefix", "", "the names' keys are under this `prefix` (ends with '/'); without NAME, show every name under it (without --prefix: every name at the root)")
	fs.BoolVar(&c.etcd, "etcd-layout", false, "the names' keys are where etcd's own primitives put them (see lock)")
	fs.BoolVar(&c.json, "json", false, "write JSON: one document, or one line per change with --watch")
	writeOut := func(v string) error {
		switch v {
		case "json":
			c.json = true
		case "simple":
			c.json = false
		default:
			return fmt.Errorf("json or simple")
		}
		c.writeOut = v
		return nil
	}
	fs.Func("write-out", "the output's `FORMAT`, as etcdctl's: json (as --json) or simple (text, the default); -w for short", writeOut)
	fs.Func("w", "", writeOut) // -w, etcdctl's short form: in the help as --write-out's
	fs.BoolVar(&c.watch, "watch", false, "show it again at every change, until interrupted")
	fs.BoolVar(&c.check, "check", false, "for probes and scripts: print nothing (unless --json), exit 0 if every NAME is held, 1 if one is free, 69 if etcd cannot be reached")
	fs.StringVar(&c.kind, "kind", "", "the `KIND` of the keys directly under a name, lock (mutex, reentrant) or election; without it, each name's is told by its keys' values: a candidate writes one that no lock writes")
	c.conn.register(fs)
	return sub
}

func (c *statusCommand) parse(sub *subcommand, args []string, a *app) error {
	names, err := sub.operands(args, a.getenv)
	if err != nil {
		return err
	}
	c.names = names
	switch {
	case c.check && len(names) == 0:
		return usagef("--check without a NAME")
	case c.check && c.watch:
		return usagef("--check and --watch exclude each other")
	case c.writeOut == "simple" && setFlags(sub.flags)["json"]:
		return usagef("--json and --write-out simple exclude each other")
	}
	switch c.kind {
	case "", admin.KindLock:
	case "election", admin.KindCandidate:
		c.kind = admin.KindCandidate
	default:
		return usagef("--kind %q: lock or election", c.kind)
	}
	if c.prefix != "" && !strings.HasSuffix(c.prefix, "/") {
		return usagef("--prefix %q does not end with '/'", c.prefix)
	}
	return validNames(names)
}

// run shows the status once, or at every change until a signal with --watch.
func (c *statusCommand) run(a *app) (int, error) {
	cli, err := c.conn.open()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	if !c.watch {
		ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
		defer cancel()
		snap, err := admin.Status(ctx, cli, c.names, c.options()...)
		if err != nil {
			return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
		}
		if c.check {
			return c.checked(a.stdout, snap)
		}
		return 0, c.print(a.stdout, snap)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	opts := append(c.options(), admin.Timeout(c.conn.commandTimeout))
	err = admin.Watch(ctx, cli, c.names, func(snap *admin.Snapshot) error { return c.printChange(a.stdout, snap) }, opts...)
	switch {
	case ctx.Err() != nil:
		return exitOK, nil // interrupted: the way --watch ends
	case errors.Is(err, admin.ErrNoAnswer):
		return 0, failf(exitEtcd, "no answer from etcd at %s within %v", c.conn.endpoints, c.conn.commandTimeout)
	case err != nil && exitCode(err) == exitEtcd:
		return 0, failf(exitEtcd, "etcd at %s: %v", c.conn.endpoints, err)
	}
	return 0, err
}

// options are the admin options of the command's flags.
func (c *statusCommand) options() []admin.Option {
	opts := []admin.Option{admin.Prefix(c.prefix)}
	if c.kind == admin.KindCandidate {
		opts = append(opts, admin.Elections())
	}
	if c.etcd {
		opts = append(opts, admin.EtcdLayout())
	}
	return opts
}

// checked is --check's exit status: 0 if every name has a holder (or a key whose state
// cannot be told: something holds it), exitFree if one has none. It prints only with --json.
func (c *statusCommand) checked(w io.Writer, snap *admin.Snapshot) (int, error) {
	if c.json {
		if err := c.print(w, snap); err != nil {
			return 0, err
		}
	}
	for _, n := range snap.Names {
		if !slices.ContainsFunc(n.Queue, func(e admin.Entry) bool { return e.State != admin.StateWaits }) {
			return exitFree, nil
		}
	}
	return exitOK, nil
}

// printChange prints a snapshot of --watch: a JSON line, or the text after a line with the
// revision and the time.
func (c *statusCommand) printChange(w io.Writer, snap *admin.Snapshot) error {
	if !c.json {
		if _, err := fmt.Fprintf(w, "--- revision %d at %s\n", snap.Revision, time.Now().UTC().Format(time.RFC3339)); err != nil {
			return err
		}
	}
	return c.print(w, snap)
}

// print writes a snapshot: as JSON, or as text, a paragraph per name. Without --kind, the
// names whose keys can only be an election's are shown as elections (tellElections).
func (c *statusCommand) print(w io.Writer, snap *admin.Snapshot) error {
	if c.kind == "" {
		snap = tellElections(snap)
	}
	if c.json {
		enc := json.NewEncoder(w)
		if !c.watch {
			enc.SetIndent("", "  ")
		}
		return enc.Encode(snap)
	}
	var b strings.Builder
	for i, ns := range snap.Names {
		if i > 0 {
			b.WriteString("\n")
		}
		writeName(&b, ns)
	}
	switch {
	case len(snap.Names) > 0:
	case c.prefix == "":
		b.WriteString("no name at the root of the keyspace (for the names under a prefix: --prefix P)\n")
	default:
		fmt.Fprintf(&b, "no name under %q\n", c.prefix)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeName writes one name's paragraph: a title, then its queue as a table.
func writeName(b *strings.Builder, ns admin.NameStatus) {
	name := printable(ns.Name)
	title := ns.Primitive
	switch {
	case ns.Primitive == "semaphore":
		title = "semaphore, limit unknown"
		if ns.Limit != nil {
			title = fmt.Sprintf("semaphore of %d", *ns.Limit)
		}
	case ns.Primitive == "barrier" && ns.Size != nil:
		title = fmt.Sprintf("barrier of %d", *ns.Size)
	case ns.Primitive == "latch" && ns.Count != nil && ns.Size != nil:
		fmt.Fprintf(b, "%s: latch, count %d of %d\n", name, *ns.Count, *ns.Size)
		return
	}
	if ns.Primitive == "barrier" && ns.Round != nil {
		title += fmt.Sprintf(", round %d", *ns.Round)
	}
	holding, waiting := 0, 0
	for _, e := range ns.Queue {
		if e.State == admin.StateHolds || e.State == admin.StateLeads || e.State == admin.StateEntered {
			holding++
		} else {
			waiting++
		}
	}
	switch {
	case len(ns.Queue) == 0 && title == "":
		fmt.Fprintf(b, "%s: nobody holds or waits\n", name)
		return
	case len(ns.Queue) == 0:
		fmt.Fprintf(b, "%s: %s, nobody holds or waits\n", name, title)
		return
	case ns.Primitive == "election":
		fmt.Fprintf(b, "%s: %s, %s, %d leading, %d waiting\n", name, title, leaderText(ns.Queue), holding, waiting)
	case ns.Primitive == "barrier":
		fmt.Fprintf(b, "%s: %s, %d entered, %d waiting\n", name, title, holding, waiting)
	default:
		fmt.Fprintf(b, "%s: %s, %d holding, %d waiting\n", name, title, holding, waiting)
	}
	// An election's candidates are known by their values (what etcdctl elect prints of the
	// leader, what transfer --to names); the other keys by their owners.
	election := ns.Primitive == "election"
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	last := "OWNER"
	if election {
		last = "VALUE"
	}
	fmt.Fprintf(tw, "  POS\tKIND\tSTATE\tKEY\tTOKEN\tLEASE\tTTL\t%s\n", last)
	for _, e := range ns.Queue {
		lease := e.Lease
		if lease == "" {
			lease = "-"
		}
		kind := e.Kind
		switch {
		case e.Units > 1:
			kind = fmt.Sprintf("%s(%d)", kind, e.Units)
		case e.Mode != "":
			kind = fmt.Sprintf("%s(%s)", kind, e.Mode)
		}
		who := ownerText(e.Owner)
		if election {
			who = valueText(e.Value)
		}
		state := e.State
		if e.Asked != nil {
			state += "(asked)"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Position, kind, state, printable(e.Key), e.Token, lease, ttlText(e), who)
	}
	tw.Flush()
	for _, e := range ns.Queue {
		if a := e.Asked; a != nil {
			fmt.Fprintf(b, "  token %d asked to let go by %s at %s: %s\n", e.Token, printable(a.By), a.At.Format(time.RFC3339), strconv.Quote(a.Reason))
		}
	}
}

// leaderText names an election's leader by its value ("leader \"web-7:8080\""), or says
// that nobody leads.
func leaderText(queue []admin.Entry) string {
	for _, e := range queue {
		if e.State == admin.StateLeads {
			return "leader " + strconv.Quote(e.Value)
		}
	}
	return "no leader"
}

// valueText shows a candidate's value: as it is, "" when empty, or quoted as printable
// quotes it.
func valueText(v string) string {
	if v == "" {
		return `""`
	}
	return printable(v)
}

// ttlText shows what the lease has left: "57s", "expired", "-" without a lease, "?" unknown.
func ttlText(e admin.Entry) string {
	switch {
	case e.Lease == "":
		return "-"
	case e.TTL == nil:
		return "?"
	case *e.TTL < 0:
		return "expired"
	}
	return fmt.Sprintf("%ds", *e.TTL)
}

// ownerText shows an owner: "web-3 pid 4711 since 2026-11-24T07:00:00Z", with the parts the
// value has, or "unknown".
func ownerText(owner map[string]string) string {
	var parts []string
	if h, ok := owner["host"]; ok {
		parts = append(parts, h)
	}
	if p, ok := owner["pid"]; ok {
		parts = append(parts, "pid "+p)
	}
	if s, ok := owner["since"]; ok {
		parts = append(parts, "since "+s)
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return printable(strings.Join(parts, " "))
}

// printable is s as the text output shows a name, a key or an owner: as it is, or, if it
// holds a control character (a newline, a tab that would break the table's columns) or is
// not UTF-8, quoted with Go's escapes ("a\nb"), so that every entry stays on its line.
// JSON output needs none of it.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, breaksLines) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// breaksLines reports whether r may break a line or its columns where it is printed: a
// control character (C0, DEL, C1: a newline, a tab, a carriage return, NEL) or Unicode's
// line and paragraph separators.
func breaksLines(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029'
}
