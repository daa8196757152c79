//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
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

// operands parses args as parse does, with no limit (a "--" ends the flags, and what
// follows it is operands too), and then the ETCDCTL_* variables of the flags the command line did not set (applyEnv).
func (s *subcommand) operands(args []string, getenv func(string) string) ([]string, error) {
	operands, rest, _, err := s.parse(args, -1)
	if err != nil {
		return nil, err
	}
	operands = append(operands, rest...) // after a "--", every argument is an operand
	return operands, applyEnv(s.flags, getenv)
}

// parse parses args, flags and operands mixed ("NAME --ttl 5s" as well as "--ttl 5s NAME"),
// and returns up to max operands (-1: no limit) and what follows them unparsed: the command
// to run, which keeps its own flags. A "--" before the first operand ends the flags only
// (for a name that starts with '-'); a "--" after an operand ends the operands, and dashed
// reports it. --help returns flag.ErrHelp; a bad flag a usage error.
func (s *subcommand) parse(args []string, max int) (operands, rest []string, dashed bool, err error) {
	flags := true
	for len(args) > 0 {
		if flags {
			if err := s.flags.Parse(args); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return nil, nil, false, err
				}
				_, msg := flagProblem(s.flags, err)
				return nil, nil, false, usagef("%s (%s --help)", msg, s.flags.Name())
			}
			consumed := len(args) - s.flags.NArg()
			ended := consumed > 0 && args[consumed-1] == "--"
			args = s.flags.Args()
			switch {
			case ended && len(operands) > 0:
				return operands, args, true, nil
			case ended:
				flags = false
			}
		}
		switch {
		case len(args) == 0:
		case !flags && args[0] == "--" && len(operands) > 0:
			return operands, args[1:], true, nil
		case len(operands) == max:
			return operands, args, false, nil
		default:
			operands, args = append(operands, args[0]), args[1:]
		}
	}
	return operands, nil, false, nil
}

// commandLine parses the command line of a command that runs CMD under NAME, as etcdctl
// lock does: "NAME CMD ARGS..." or "NAME -- CMD ARGS...". When a "--" comes after NAME,
// every operand before it is an operand of etcdsync's (lock's several names, elect's
// PROPOSAL) and CMD follows it; without one, the first operand is NAME and the rest, from
// the next operand on, is CMD ARGS. Flags may come anywhere before CMD. With alwaysDashed
// (elect), every operand up to a "--" is etcdsync's, and CMD comes only after one.
func (s *subcommand) commandLine(args []string, alwaysDashed bool) (operands, command []string, err error) {
	if !alwaysDashed {
		operands, rest, dashed, err := s.parse(args, 1)
		if err != nil || dashed || !slices.Contains(rest, "--") {
			return operands, rest, err
		}
	}
	operands, command, _, err = s.parse(args, -1)
	return operands, command, err
}

// printHelp writes the subcommand's help: usage, what it does, an example and its flags,
// every line within helpWidth.
func (s *subcommand) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: etcdsync %s\n\n%s\n\nExample:\n%s\n\nFlags:\n", s.synopsis, wrap(s.about, ""), indent(s.example))
	s.flags.VisitAll(func(f *flag.Flag) {
		if f.Usage == "" {
			return // defined only to be refused with a message of its own (elect --try), or an alias (-w)
		}
		kind, usage := flag.UnquoteUsage(f)
		line := "  " + spelled(f.Name) // as the synopses write it: -n N, --ttl D
		if kind == "duration" {
			kind = "D" // as the synopses and docs write a duration: --timeout D
		}
		if kind != "" {
			line += " " + kind
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n%s\n", line, wrap(usage, "        "))
	})
}

// The errors of the flag package's Parse, which name a flag with one dash ("-ttl"), as the
// help never writes it: flagProblem rewrites them. A test holds them to Go's wording.
var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	flagNeedsArg  = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	invalidValue  = regexp.MustCompile(`^invalid value "(.*)" for flag -+([^:]*): (.*)$`)
	invalidBool   = regexp.MustCompile(`^invalid boolean value "(.*)" for -+([^:]*): (.*)$`)
)

// flagProblem rewrites err, an error of fs.Parse, as the help writes flags ("--ttl", "-n"),
// and returns the flag it names ("" for none) and the message.
func flagProblem(fs *flag.FlagSet, err error) (name, msg string) {
	msg = err.Error()
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		return m[1], "unknown flag " + spelled(m[1])
	}
	if m := flagNeedsArg.FindStringSubmatch(msg); m != nil {
		return m[1], spelled(m[1]) + " needs a value"
	}
	if m := invalidBool.FindStringSubmatch(msg); m != nil {
		return m[2], fmt.Sprintf("%s=%s: true or false", spelled(m[2]), m[1])
	}
	if m := invalidValue.FindStringSubmatch(msg); m != nil {
		value, name, why := m[1], m[2], m[3]
		return name, fmt.Sprintf("%s %s: %s", spelled(name), quoteValue(value), valueProblem(fs.Lookup(name), value, why))
	}
	return "", msg
}

// valueProblem says what is wrong with value, which flag f (nil if unknown) refused with
// why: for a duration, how to write one.
func valueProblem(f *flag.Flag, value, why string) string {
	var v any
	if f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			v = g.Get()
		}
	}
	switch v.(type) {
	case time.Duration:
		if _, err := strconv.ParseFloat(value, 64); err == nil {
			return fmt.Sprintf("durations need a unit, e.g. %ss", value)
		}
		return "not a duration: write it with a unit, e.g. 10s, 1m30s or 2h"
	case int, int64, uint, uint64:
		if strings.Contains(why, "out of range") {
			return "out of range"
		}
		return "not a whole number"
	case bool:
		return "true or false"
	}
	return why
}

// quoteValue is a flag's value as a message shows it: as it is, or quoted if it is empty or
// holds a space, a quote or a character that breaks lines.
func quoteValue(v string) string {
	if v == "" || strings.ContainsAny(v, " \"'") || strings.IndexFunc(v, breaksLines) >= 0 {
		return strconv.Quote(v)
	}
	return v
}

// spelled is the flag name as the help writes it: "-n" for one letter, else "--ttl".
func spelled(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// setFlags is the names of the flags set on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
