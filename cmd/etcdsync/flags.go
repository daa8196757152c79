//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// subcommand is one of etcdsync's commands: its flags, and the help that --help prints.
type subcommand struct {
	synopsis string // the usage line after "etcdsync "
	about    string // what it does, a paragraph
	example  string // shell lines, each with a comment
	flags    *flag.FlagSet
}

// newSubcommand returns a subcommand whose flag set reports errors to the caller only: the
// flag package's own output (the error, then every flag) would be many lines.
func newSubcommand(name, about, example string) *subcommand {
	fs := flag.NewFlagSet("etcdsync "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &subcommand{synopsis: synopsis(name), about: about, example: example, flags: fs}
}

// operands parses args as parse does, with no limit and nothing after the operands, and
// then the ETCDCTL_* variables of the flags the command line did not set (applyEnv).
func (s *subcommand) operands(args []string, getenv func(string) string) ([]string, error) {
	operands, _, err := s.parse(args, -1)
	if err != nil {
		return nil, err
	}
	return operands, applyEnv(s.flags, getenv)
}

// parse parses args, flags and operands mixed ("NAME --ttl 5s" as well as "--ttl 5s NAME"),
// and returns up to max operands (-1: no limit) and what follows them unparsed: the command
// to run, which keeps its own flags. A "--" ends the flags and is dropped; whatever follows
// it is operands, then the rest. --help returns flag.ErrHelp; a bad flag a usage error.
func (s *subcommand) parse(args []string, max int) (operands, rest []string, err error) {
	flags := true
	for len(args) > 0 {
		if flags {
			if err := s.flags.Parse(args); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return nil, nil, err
				}
				return nil, nil, usagef("%v (%s --help)", err, s.flags.Name())
			}
			consumed := len(args) - s.flags.NArg()
			flags = consumed == 0 || args[consumed-1] != "--"
			args = s.flags.Args()
		}
		if len(args) == 0 || len(operands) == max {
			break
		}
		operands, args = append(operands, args[0]), args[1:]
	}
	return operands, args, nil
}

// printHelp writes the subcommand's help: usage, what it does, an example and its flags.
func (s *subcommand) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: etcdsync %s\n\n%s\n\nExample:\n%s\n\nFlags:\n", s.synopsis, s.about, indent(s.example))
	s.flags.VisitAll(func(f *flag.Flag) {
		if f.Usage == "" {
			return // defined only to be refused with a message of its own (elect --try)
		}
		kind, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name // as the synopses write it: -n N
		}
		if kind != "" {
			line += " " + kind
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

func indent(text string) string {
	return "  " + strings.ReplaceAll(strings.TrimSpace(text), "\n", "\n  ")
}

// setFlags is the names of the flags set on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
