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
	names  []string
	prefix string
	json   bool
	watch  bool
	check  bool   // exit 0 if every name is held, exitFree if one is free
	kind   string // what to call the keys directly under a name: lock or election
	conn   connection
}

func (c *statusCommand) define() *subcommand {
	sub := newSubcommand("status",
		`Shows every holder and waiter of each NAME, in the order they are served: its kind
(read, write, permit, permit(N) for one of N units, candidate or lock), position, state (holds, leads, waits), key,
token (the key's create revision), lease and the TTL it has left, and its owner (host,
pid and since when) if the key's value names one, else "unknown". Works on the names
of every etcdsync primitive and of etcd's own concurrency.Mutex, Election and etcdctl.
Without NAME, shows every name under --prefix, or at the root of the keyspace, where
names go by default (a name under a prefix is shown with --prefix).`,
		`# who runs the nightly report, and who waits for it
etcdsync status nightly-report
# every name at the root of the keyspace, etcdctl's and etcd's concurrency package's too
etcdsync status
# every name under app/, for a script, and again at every change
etcdsync status --prefix app/ --json --watch`)
	fs := sub.flags
	fs.StringVar(&c.prefix, "prefix", "", "the names' keys are under this `prefix` (ends with '/'); without NAME, show every name under it\n(without --prefix: every name at the root)")
	fs.BoolVar(&c.json, "json", false, "write JSON: one document, or one line per change with --watch")
	fs.BoolVar(&c.watch, "watch", false, "show it again at every change, until interrupted")
	fs.BoolVar(&c.check, "check", false, "for probes and scripts: print nothing (unless --json), exit 0 if every NAME is held,\n1 if one is free, 69 if etcd cannot be reached")
	fs.StringVar(&c.kind, "kind", admin.KindLock, "what the keys directly under a name are: lock (mutex, reentrant) or election")
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
	}
	switch c.kind {
	case admin.KindLock:
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
	opts := append(c.options(), admin.WithTimeout(c.conn.commandTimeout))
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
	opts := []admin.Option{admin.WithPrefix(c.prefix)}
	if c.kind == admin.KindCandidate {
		opts = append(opts, admin.Elections())
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

// print writes a snapshot: as JSON, or as text, a paragraph per name.
func (c *statusCommand) print(w io.Writer, snap *admin.Snapshot) error {
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
		fmt.Fprintf(b, "%s: %s, %d leading, %d waiting\n", name, title, holding, waiting)
	case ns.Primitive == "barrier":
		fmt.Fprintf(b, "%s: %s, %d entered, %d waiting\n", name, title, holding, waiting)
	default:
		fmt.Fprintf(b, "%s: %s, %d holding, %d waiting\n", name, title, holding, waiting)
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  POS\tKIND\tSTATE\tKEY\tTOKEN\tLEASE\tTTL\tOWNER")
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
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Position, kind, e.State, printable(e.Key), e.Token, lease, ttlText(e), ownerText(e.Owner))
	}
	tw.Flush()
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
