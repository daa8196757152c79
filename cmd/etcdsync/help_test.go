//go:build unix

package main

import (
	"bytes"
	"flag"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helpOf runs etcdsync with args in this process and returns what it wrote to stdout; it
// must exit 0 and write nothing to stderr.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &app{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }})
	require.Equal(t, 0, code, "%q: %s", args, stderr.String())
	require.Empty(t, stderr.String(), "%q", args)
	return stdout.String()
}

// TestHelpGolden: `etcdsync help` and `etcdsync help COMMAND` of every command are what
// testdata/help*.txt hold, and `COMMAND --help` is `help COMMAND`. After a change of the help,
// run with -update and read the diff.
func TestHelpGolden(t *testing.T) {
	golden(t, "help.txt", helpOf(t, "help"))
	assert.Equal(t, helpOf(t, "help"), helpOf(t, "--help"))
	for _, u := range usages {
		if u.verb == "help" || u.verb == "version" {
			continue
		}
		out := helpOf(t, "help", u.verb)
		golden(t, "help-"+u.verb+".txt", out)
		assert.Equal(t, out, helpOf(t, u.verb, "--help"), u.verb)
		assert.True(t, strings.HasPrefix(out, "Usage: etcdsync "+synopsis(u.verb)+"\n"), u.verb)
	}
}

// TestVersionPrintsTheModuleAndGoVersions: `etcdsync --version` and `etcdsync version` print
// the version from the build info (a test binary is "(devel)") and the Go version, exit 0.
func TestVersionPrintsTheModuleAndGoVersions(t *testing.T) {
	out := helpOf(t, "--version")
	assert.Equal(t, out, helpOf(t, "version"))
	assert.Regexp(t, `^etcdsync \(devel\)( [0-9a-f]{12})? go1\.\d+\S* \w+/\w+\n$`, out)
	assert.Contains(t, out, " "+runtime.Version()+" ")
}

// TestDocsAgreeWithHelp: docs/command.md and doc.go show the usage etcdsync --help prints,
// docs/command.md's table of exit statuses has the statuses of the help's, and it describes
// every flag of every command but the connection flags (described together).
func TestDocsAgreeWithHelp(t *testing.T) {
	docs, err := os.ReadFile("../../docs/command.md")
	require.NoError(t, err)
	godoc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	lines := usageLines()
	assert.True(t, strings.Contains(string(docs), "```\n"+strings.Join(lines, "\n")+"\n```\n"), "docs/command.md's usage is not:\n%s", strings.Join(lines, "\n"))
	assert.True(t, strings.Contains(string(godoc), "//\t"+strings.Join(lines, "\n//\t")+"\n"), "doc.go's usage is not:\n%s", strings.Join(lines, "\n"))

	statuses := func(text, pattern string) []string {
		var out []string
		for _, m := range regexp.MustCompile(pattern).FindAllStringSubmatch(text, -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return out
	}
	help := helpOf(t, "help")
	inHelp := statuses(help, `(?m)^  (\d+(?:\+N)?) `)
	require.NotEmpty(t, inHelp)
	assert.Equal(t, inHelp, statuses(string(docs), `(?m)^\| (\d+(?:\+N)?) \|`), "exit statuses of the help and of docs/command.md")

	connection := map[string]bool{}
	for _, name := range connectionFlags {
		connection[name] = true
	}
	for _, u := range usages {
		c := newCommand(u.verb)
		if c == nil {
			continue
		}
		c.define().flags.VisitAll(func(f *flag.Flag) {
			spelled := "`--" + f.Name
			if len(f.Name) == 1 {
				spelled = "`-" + f.Name
			}
			if !connection[f.Name] && f.Usage != "" {
				assert.True(t, strings.Contains(string(docs), spelled), "%s's flag %s is not in docs/command.md", u.verb, f.Name)
			}
		})
	}
}
