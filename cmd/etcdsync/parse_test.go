//go:build unix

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/admin"
)

// TestFlagsAndOperandsMix: flags may come before and after the names. The command follows
// NAME as etcdctl lock's does, or a "--": without a "--" after NAME, the first operand is
// NAME and the rest, from the next operand on, the command, its own flags untouched; with
// one, every operand before it is a name (lock: sorted, once each) and the command follows
// it. A "--" before the first name ends the flags only. elect takes NAME [PROPOSAL], and
// its command only after a "--".
func TestFlagsAndOperandsMix(t *testing.T) {
	for _, tc := range []struct {
		verb    string
		args    []string
		names   []string
		command []string
		ttl     string
	}{
		{"lock", []string{"n"}, []string{"n"}, nil, "1m0s"},
		{"lock", []string{"--ttl", "5s", "n"}, []string{"n"}, nil, "5s"},
		{"lock", []string{"n", "--ttl", "5s"}, []string{"n"}, nil, "5s"},
		{"lock", []string{"n", "--ttl", "5s", "--", "ls", "-l"}, []string{"n"}, []string{"ls", "-l"}, "5s"},
		{"lock", []string{"n", "--", "ls", "--ttl", "5s"}, []string{"n"}, []string{"ls", "--ttl", "5s"}, "1m0s"},
		{"lock", []string{"-ttl=5s", "n", "--", "--ttl"}, []string{"n"}, []string{"--ttl"}, "5s"},
		{"lock", []string{"--", "-n", "--", "ls"}, []string{"-n"}, []string{"ls"}, "1m0s"},
		{"lock", []string{"--", "-n", "ls"}, []string{"-n"}, []string{"ls"}, "1m0s"},
		{"lock", []string{"n", "--"}, []string{"n"}, nil, "1m0s"},
		{"lock", []string{"b", "--ttl", "5s", "a", "b", "--", "ls", "--", "x"}, []string{"a", "b"}, []string{"ls", "--", "x"}, "5s"},
		{"lock", []string{"b", "a", "--"}, []string{"a", "b"}, nil, "1m0s"},
		// etcdctl's form: NAME CMD ARGS...
		{"lock", []string{"n", "ls", "-l"}, []string{"n"}, []string{"ls", "-l"}, "1m0s"},
		{"lock", []string{"n", "--ttl", "5s", "ls", "--ttl", "7s"}, []string{"n"}, []string{"ls", "--ttl", "7s"}, "5s"},
		{"lock", []string{"b", "a"}, []string{"b"}, []string{"a"}, "1m0s"},
		{"rlock", []string{"n", "ls", "--ttl", "5s"}, []string{"n"}, []string{"ls", "--ttl", "5s"}, "1m0s"},
		{"rlock", []string{"--", "-n", "ls"}, []string{"-n"}, []string{"ls"}, "1m0s"},
		{"sem", []string{"-n", "2", "n", "ls", "-l"}, []string{"n"}, []string{"ls", "-l"}, "1m0s"},
		{"elect", []string{"n"}, []string{"n"}, nil, "1m0s"},
		{"elect", []string{"n", "web-7:8080"}, []string{"n"}, nil, "1m0s"},
		{"elect", []string{"n", "--ttl", "5s", "web-7:8080", "--", "ls", "-l"}, []string{"n"}, []string{"ls", "-l"}, "5s"},
		{"elect", []string{"n", "--", "ls"}, []string{"n"}, []string{"ls"}, "1m0s"},
	} {
		c := &holdCommand{verb: tc.verb}
		sub := c.define()
		err := c.parse(sub, tc.args, &app{getenv: func(string) string { return "" }})
		require.NoError(t, err, "%q", tc.args)
		assert.Equal(t, tc.names, c.names, "%q", tc.args)
		assert.Equal(t, tc.names[0], c.name, "%q", tc.args)
		assert.Equal(t, tc.command, c.command, "%q", tc.args)
		assert.Equal(t, tc.ttl, c.ttl.String(), "%q", tc.args)
	}
}

// TestElectTakesAProposal: elect's second operand is the candidate's value, as etcdctl
// elect's PROPOSAL; without one, --value's, or etcdsync's owner marked as a candidate's.
func TestElectTakesAProposal(t *testing.T) {
	value := func(args ...string) string {
		c := &holdCommand{verb: "elect"}
		require.NoError(t, c.parse(c.define(), args, &app{getenv: func(string) string { return "" }}), "%q", args)
		return c.value
	}
	assert.Equal(t, "web-7:8080", value("n", "web-7:8080"))
	assert.Equal(t, "web-7:8080", value("n", "web-7:8080", "--", "ls"))
	assert.Equal(t, "v", value("--value", "v", "n", "--", "ls"))
	assert.Regexp(t, `^host=\S+ pid=\d+ since=\S+ role=candidate$`, value("n", "--", "ls"))
}

// TestOperandsThatAreNotNamesAreUsageErrors: only lock takes several names; elect takes
// NAME [PROPOSAL], and the value once.
func TestOperandsThatAreNotNamesAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		verb string
		args []string
		want string
	}{
		{"rlock", []string{"a", "b", "--", "ls"}, `2 names before "--": rlock takes one NAME (only lock takes several)`},
		{"sem", []string{"-n", "1", "a", "b", "--", "ls"}, `2 names before "--": sem takes one NAME`},
		{"elect", []string{"n", "p", "ls"}, `3 operands before the command: elect takes NAME [PROPOSAL], and CMD only after "--"`},
		{"elect", []string{"n", "p", "x", "--", "ls"}, `3 operands before the command`},
		{"elect", []string{"--value", "v", "n", "p"}, `the candidate's value twice: --value and PROPOSAL "p"`},
		{"lock", []string{"n", "ls", "-l", "--", "x"}, `unknown flag -l (etcdsync lock --help)`},
	} {
		c := &holdCommand{verb: tc.verb}
		err := c.parse(c.define(), tc.args, &app{getenv: func(string) string { return "" }})
		require.Error(t, err, "%q", tc.args)
		assert.Equal(t, exitUsage, exitCode(err), "%q", tc.args)
		assert.Contains(t, err.Error(), tc.want, "%q", tc.args)
	}
	b := &barrierCommand{}
	err := b.parse(b.define(), []string{"-n", "2", "a", "b", "--", "ls"}, &app{getenv: func(string) string { return "" }})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `2 names before "--": barrier takes one NAME`)
}

// TestStatusTakesNamesAndFlagsMixed: status's names may come around its flags.
func TestStatusTakesNamesAndFlagsMixed(t *testing.T) {
	c := &statusCommand{}
	sub := c.define()
	require.NoError(t, c.parse(sub, []string{"a", "--json", "b", "--kind", "election", "--", "--c"}, &app{getenv: func(string) string { return "" }}))
	assert.Equal(t, []string{"a", "b", "--c"}, c.names)
	assert.True(t, c.json)
	assert.Equal(t, admin.KindCandidate, c.kind)
}

// TestEtcdctlVariablesAreDefaultsOfTheFlags: ETCDCTL_* set the connection flags the command
// line leaves unset; a flag wins over its variable.
func TestEtcdctlVariablesAreDefaultsOfTheFlags(t *testing.T) {
	env := map[string]string{
		"ETCDCTL_ENDPOINTS":    "https://e1:2379,https://e2:2379",
		"ETCDCTL_USER":         "bob:secret",
		"ETCDCTL_DIAL_TIMEOUT": "7s",
		"ETCDCTL_CACERT":       "/nonexistent/ca.pem",
	}
	c := &holdCommand{verb: "lock"}
	sub := c.define()
	require.NoError(t, c.parse(sub, []string{"--dial-timeout", "3s", "n"}, &app{getenv: func(k string) string { return env[k] }}))
	assert.Equal(t, "https://e1:2379,https://e2:2379", c.conn.endpoints)
	assert.Equal(t, "3s", c.conn.dialTimeout.String())
	assert.Equal(t, "/nonexistent/ca.pem", c.conn.cacert)
	c.conn.cacert = "" // no file to read: the rest of the configuration
	cfg, err := c.conn.config()
	require.NoError(t, err)
	assert.Equal(t, []string{"https://e1:2379", "https://e2:2379"}, cfg.Endpoints)
	assert.Equal(t, "bob", cfg.Username)
	assert.Equal(t, "secret", cfg.Password)
	assert.NotNil(t, cfg.TLS, "https endpoints use TLS")
}

// TestOwnerText: status's text shows an owner's host, pid and since, or "unknown".
func TestOwnerText(t *testing.T) {
	assert.Equal(t, "web-3 pid 4711 since T", ownerText(map[string]string{"host": "web-3", "pid": "4711", "since": "T"}))
	assert.Equal(t, "unknown", ownerText(nil))
}

// TestShellQuote: the lines printed without a command can be given to a POSIX shell.
func TestShellQuote(t *testing.T) {
	assert.Equal(t, "nightly/6d4_0", shellQuote("nightly/6d4_0"))
	assert.Equal(t, "'a b'", shellQuote("a b"))
	assert.Equal(t, `'it'\''s'`, shellQuote("it's"))
	assert.Equal(t, "''", shellQuote(""))
}

// TestNamesThatBreakLinesAreUsageErrors: a hold command refuses a name or a --prefix with a
// control character or a Unicode line or paragraph separator (exit 64, naming the
// character), since ETCDSYNC_NAME and ETCDSYNC_KEY list one name or key per line; a name
// with other characters outside ASCII is taken.
func TestNamesThatBreakLinesAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		char string // as the message names it
	}{
		{[]string{"a\nb"}, "U+000A"},
		{[]string{"ok", "a\rb"}, "U+000D"},
		{[]string{"tab\there"}, "U+0009"},
		{[]string{"bell\a"}, "U+0007"},
		{[]string{"del\x7f"}, "U+007F"},
		{[]string{"nel\u0085"}, "U+0085"},
		{[]string{"line\u2028sep"}, "U+2028"},
		{[]string{"para\u2029sep"}, "U+2029"},
		{[]string{"--prefix", "app\n/", "n"}, "U+000A"},
	} {
		c := &holdCommand{verb: "lock"}
		err := c.parse(c.define(), append(tc.args, "--", "true"), &app{getenv: func(string) string { return "" }})
		require.Error(t, err, "%q", tc.args)
		assert.Equal(t, exitUsage, exitCode(err), "%q", tc.args)
		assert.Contains(t, err.Error(), tc.char, "%q", tc.args)
		assert.Contains(t, err.Error(), "one per line", "%q", tc.args)
		assert.NotContains(t, message(err.Error()), "\n", "%q: the message spans lines", tc.args)
	}
	c := &holdCommand{verb: "lock"}
	require.NoError(t, c.parse(c.define(), []string{"überweisung/ä", "space ok", "--", "true"}, &app{getenv: func(string) string { return "" }}))
}
