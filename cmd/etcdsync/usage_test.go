//go:build unix

package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// usageCases are command lines that are usage errors, found before any I/O, with the
// environment each runs with.
var usageCases = []struct {
	env  map[string]string
	args []string
}{
	{nil, []string{"lock", "--ttl", "10", "n"}},
	{nil, []string{"lock", "--ttl", "soon", "n"}},
	{nil, []string{"lock", "--grace=1.5", "n"}},
	{nil, []string{"lock", "--bogus", "n"}},
	{nil, []string{"lock", "n", "--ttl"}},
	{nil, []string{"lock", "--try=maybe", "n"}},
	{nil, []string{"lock"}},
	{nil, []string{"lock", "n", "ls", "-l", "--", "x"}},
	{nil, []string{"sem", "-n", "many", "n"}},
	{nil, []string{"sem", "-n", "99999999999999999999", "n"}},
	{nil, []string{"sem", "-x", "n"}},
	{nil, []string{"rlock", "a", "b", "--", "ls"}},
	{nil, []string{"barrier", "-n", "2", "a", "b", "--", "ls"}},
	{nil, []string{"elect", "n", "web-7:8080", "ls"}},
	{nil, []string{"elect", "--value", "v", "n", "web-7:8080"}},
	{nil, []string{"--ttl", "5s", "lock", "n"}},
	{nil, []string{"--dial-timeout", "10", "lock", "n"}},
	{map[string]string{"ETCDCTL_DIAL_TIMEOUT": "10"}, []string{"lock", "n"}},
	{map[string]string{"ETCDCTL_COMMAND_TIMEOUT": "soon"}, []string{"status", "n"}},
	{nil, []string{"status", "-w", "table", "n"}},
	{nil, []string{"status", "--write-out", "simple", "--json", "n"}},
	{nil, []string{"status", "--kind", "mutex", "n"}},
	{nil, []string{"transfer", "--to", "", "n"}},
	{nil, []string{"latch", "--set", "three", "n"}},
	{nil, []string{"help", "nosuch"}},
	{nil, []string{"help", "lock", "sem"}},
	{nil, []string{"nosuch"}},
	{nil, []string{}},
}

// TestUsageErrorsGolden: every usage error above is exit 64 and one line on stderr, with
// one prefix, flags spelled as the help spells them (--ttl, -n) and a hint for a duration
// without a unit; stdout stays empty. testdata/usage-errors.txt holds the lines; after a
// change of a message, run with -update and read the diff.
func TestUsageErrorsGolden(t *testing.T) {
	var all strings.Builder
	for _, tc := range usageCases {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &app{stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return tc.env[k] }})
		assert.Equal(t, exitUsage, code, "%q: %s", tc.args, stderr.String())
		assert.Empty(t, stdout.String(), "%q", tc.args)
		msg := stderr.String()
		assert.Equal(t, 1, strings.Count(msg, "\n"), "%q: not one line: %s", tc.args, msg)
		assert.Regexp(t, `^etcdsync( \w+)?: `, msg, "%q", tc.args)
		assert.NotContains(t, msg, "etcdsync: etcdsync", "%q: the prefix stutters", tc.args)
		assert.NotContains(t, msg, ": etcdsync: ", "%q: the prefix stutters", tc.args)
		assert.NotRegexp(t, `(^|[ (])-[a-z][a-z-]+`, msg, "%q: a flag of several letters with one dash", tc.args)
		var env []string
		for k, v := range tc.env {
			env = append(env, k+"="+v+" ")
		}
		args := make([]string, len(tc.args))
		for i, a := range tc.args {
			args[i] = shellQuote(a)
		}
		fmt.Fprintf(&all, "$ %s%s\n%s", strings.Join(env, ""), strings.Join(append([]string{"etcdsync"}, args...), " "), msg)
	}
	golden(t, "usage-errors.txt", all.String())
}

// TestFlagErrorsAreGosWording: flagProblem rewrites the flag package's errors by their
// wording, which Go could change: each one is still recognised.
func TestFlagErrorsAreGosWording(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Duration("ttl", 0, "")
	fs.Int("n", 0, "")
	fs.Bool("try", false, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag --bogus"},
		{[]string{"--ttl"}, "--ttl needs a value"},
		{[]string{"--ttl", "10"}, "--ttl 10: durations need a unit, e.g. 10s"},
		{[]string{"-n", "x"}, "-n x: not a whole number"},
		{[]string{"--try=x"}, "--try=x: true or false"},
	} {
		err := fs.Parse(tc.args)
		require.Error(t, err, "%q", tc.args)
		_, msg := flagProblem(fs, err)
		assert.Equal(t, tc.want, msg, "%q: Go's error %q", tc.args, err)
	}
}

// TestHelpFitsIn80Columns: every help text, etcdsync's and each command's, has no line
// longer than 80 columns and no tab.
func TestHelpFitsIn80Columns(t *testing.T) {
	texts := map[string]string{"help": helpOf(t, "help")}
	for _, u := range usages {
		if newCommand(u.verb) != nil {
			texts["help "+u.verb] = helpOf(t, "help", u.verb)
		}
	}
	for topic, text := range texts {
		for i, line := range strings.Split(text, "\n") {
			assert.LessOrEqual(t, len([]rune(line)), 80, "%s, line %d: %q", topic, i+1, line)
			assert.NotContains(t, line, "\t", "%s, line %d", topic, i+1)
		}
	}
}
