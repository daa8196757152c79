//go:build unix

package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testBadInput: bad flags, arguments, names and variables end with 64 and one line on stderr
// that names the problem, and write nothing to etcd.
func testBadInput(t *testing.T, h *harness) {
	const name = "cmd-bad-input"
	cases := []struct {
		args   []string
		env    []string
		stderr string // what the one line says
	}{
		{[]string{}, nil, "etcdsync: no command"},
		{[]string{"unlock", name}, nil, `etcdsync: no command "unlock"`},
		{[]string{"--endpoints", "127.0.0.1:1"}, nil, "etcdsync: no command"},
		{[]string{"--ttl", "5s", "lock", name}, nil, "etcdsync: --ttl: only etcd's connection flags"},
		{[]string{"--endpoints", "127.0.0.1:1", "--", "lock", name}, nil, `etcdsync: "--" before the command`},
		{[]string{"lock"}, nil, "etcdsync lock: NAME missing"},
		{[]string{"lock", "--bogus", name}, nil, "etcdsync lock: unknown flag --bogus (etcdsync lock --help)"},
		{[]string{"lock", "--ttl", "soon", name}, nil, "etcdsync lock: --ttl soon: not a duration"},
		{[]string{"lock", "--ttl", "500ms", name, "--", "true"}, nil, "etcdsync lock: mutex \"cmd-bad-input\": invalid option: TTL 500ms is under 1s"},
		{[]string{"lock", "--prefix", "app", name, "--", "true"}, nil, `does not end with '/'`},
		{[]string{"lock", "", "--", "true"}, nil, "etcdsync lock: invalid name: empty"},
		{[]string{"lock", strings.Repeat("n", 513), "--", "true"}, nil, "etcdsync lock: invalid name: 513 bytes, more than 512"},
		{[]string{"lock", "\xff", "--", "true"}, nil, "is not valid UTF-8"},
		{[]string{"lock", "a\nb", "--", "true"}, nil, `etcdsync lock: invalid name "a\nb": it holds U+000A, a control character or line separator`},
		{[]string{"sem", "-n", "2", "--prefix", "app\u2028/", name, "--", "true"}, nil, `etcdsync sem: invalid --prefix "app\u2028/": it holds U+2028`},
		{[]string{"lock", name, "", "--", "true"}, nil, "etcdsync lock: invalid name: empty"},
		{append(append([]string{"lock"}, manyNames(65)...), "--"), nil, "etcdsync lock: 65 names: at most 64 at once"},
		{[]string{"lock", "--ttl", "10", name}, nil, "etcdsync lock: --ttl 10: durations need a unit, e.g. 10s"},
		{[]string{"rlock", name, "other", "--", "true"}, nil, `etcdsync rlock: 2 names before "--": rlock takes one NAME`},
		{[]string{"elect", name, "proposal", "true"}, nil, "etcdsync elect: 3 operands before the command"},
		{[]string{"help", "nosuch"}, nil, `etcdsync help: no command "nosuch"`},
		{[]string{"status", "-w", "table", name}, nil, "etcdsync status: -w table: json or simple"},
		{[]string{"lock", "--timeout", "-1s", name}, nil, "etcdsync lock: --timeout -1s is negative"},
		{[]string{"lock", "--try", "--timeout", "1s", name}, nil, "etcdsync lock: --try and --timeout exclude each other"},
		{[]string{"lock", "--shell", name}, nil, "etcdsync lock: --shell without a command"},
		{[]string{"lock", "--command-failed", "1", name}, nil, "etcdsync lock: --command-failed without a command"},
		{[]string{"lock", "--command-failed", "0", name, "--", "true"}, nil, "etcdsync lock: --command-failed 0: from 1 to 122"},
		{[]string{"lock", "--command-failed", "75", name, "--", "true"}, nil, "etcdsync lock: --command-failed 75: from 1 to 122, but not 64, 69 or 75"},
		{[]string{"lock", "--command-failed", "130", name, "--", "true"}, nil, "etcdsync lock: --command-failed 130: "},
		{[]string{"elect", "--loop", name}, nil, "etcdsync elect: --loop without a command"},
		{[]string{"lock", "--user", "bob", name}, nil, `etcdsync lock: --user "bob" needs a name and a password`},
		{[]string{"lock", "--cert", "c.pem", name}, nil, "etcdsync lock: --cert and --key go together"},
		{[]string{"lock", name}, []string{"ETCDCTL_DIAL_TIMEOUT=soon"}, "etcdsync lock: ETCDCTL_DIAL_TIMEOUT=soon is not a valid --dial-timeout: not a duration"},
		{[]string{"sem", name, "--", "true"}, nil, "etcdsync sem: -n N missing"},
		{[]string{"once", name, "--", "true"}, nil, "etcdsync once: --every D missing"},
		{[]string{"once", "--every", "500ms", name, "--", "true"}, nil, "etcdsync once: --every 500ms: 1s or more"},
		{[]string{"once", "--every", "1h", name}, nil, "etcdsync once: CMD missing"},
		{[]string{"once", "--every", "1h", name, "other", "--", "true"}, nil, `etcdsync once: 2 names before "--"`},
		{[]string{"sem", "-n", "0", name, "--", "true"}, nil, "etcdsync sem: semaphore \"cmd-bad-input\": invalid option"},
		{[]string{"sem", "-n", "many", name}, nil, "etcdsync sem: -n many: not a whole number"},
		{[]string{"sem", "-n", "4", "--units", "5", name}, nil, "etcdsync sem: --units 5: from 1 to -n 4"},
		{[]string{"sem", "-n", "4", "--units", "0", name}, nil, "etcdsync sem: --units 0: from 1 to -n 4"},
		{[]string{"elect", "--try", name}, nil, "etcdsync elect: --try: an election has no try"},
		{[]string{"rlock", "--value", "v", name}, nil, "etcdsync rlock: unknown flag --value"},
		{[]string{"status", "--prefix", "app"}, nil, `etcdsync status: --prefix "app" does not end with '/'`},
		{[]string{"status", "--kind", "mutex", name}, nil, `etcdsync status: --kind "mutex": lock or election`},
		{[]string{"status", name, ""}, nil, "etcdsync status: invalid name: empty"},
		{[]string{"status", "--check"}, nil, "etcdsync status: --check without a NAME"},
		{[]string{"release", "--token", "5"}, nil, "etcdsync release: NAME missing"},
		{[]string{"release", "--token", "-5", name}, nil, "etcdsync release: --token -5 is negative"},
		{[]string{"ask", "--token", "5"}, nil, "etcdsync ask: NAME missing"},
		{[]string{"ask", "--token", "5", name, "other"}, nil, "etcdsync ask: 2 names: ask asks the hold of one NAME"},
		{[]string{"ask", "--token", "-5", name}, nil, "etcdsync ask: --token -5 is negative"},
		{[]string{"ask", "--token", "5", "--reason", "", name}, nil, "etcdsync ask: --reason is empty"},
		{[]string{"ask", "--token", "5", "--reason", strings.Repeat("r", 1025), name}, nil, "etcdsync ask: invalid option: a reason of 1025 bytes, more than 1024"},
		{[]string{"lock", "--detach", "--yield-on-ask", name}, nil, "etcdsync lock: --yield-on-ask: a detached hold has nobody to heed an ask"},
		{[]string{"elect", "--yield-on-ask", name}, nil, "etcdsync elect: unknown flag --yield-on-ask"},
		{[]string{"status", "--check", "--watch", name}, nil, "etcdsync status: --check and --watch exclude each other"},
	}
	cli := cluster.Client(t)
	for _, tc := range cases {
		p := h.run(t, environ(tc.env...), tc.args...)
		assert.Equal(t, exitUsage, p.code, "%q: %s", tc.args, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync")
		assert.Contains(t, p.stderr.text(), tc.stderr, "%q", tc.args)
		assert.NotContains(t, p.stderr.text(), ": etcdsync: ", "%q: the prefix stutters", tc.args)
		assert.Empty(t, p.stdout.text(), "%q", tc.args)
	}
	nothingLeft(t, cli, "", name)
	nothingLeft(t, cli, "app/", name)
}

// testHelp: --help on every subcommand, and `help SUBCOMMAND`, shows its usage, an example
// and its flags on stdout, with exit 0.
func testHelp(t *testing.T, h *harness) {
	for _, sub := range []string{"lock", "rlock", "sem", "elect", "barrier", "latch", "status"} {
		for _, args := range [][]string{{sub, "--help"}, {"help", sub}} {
			p := h.run(t, environ(), args...)
			assert.Equal(t, 0, p.code, "%q", args)
			out := p.stdout.text()
			assert.True(t, strings.HasPrefix(out, "Usage: etcdsync "+sub), "%q:\n%s", args, out)
			for _, want := range []string{"Example:\n  # ", "\nFlags:\n", "--endpoints URLs"} {
				assert.Contains(t, out, want, "%q", args)
			}
			assert.Empty(t, p.stderr.text())
			// The help agrees with what the command takes, and spells flags as the usage does.
			switch sub {
			case "elect":
				assert.NotContains(t, out, "--try", "elect refuses --try")
				assert.Contains(t, out, "--loop")
			case "sem":
				assert.Contains(t, out, "\n  -n N\n")
				assert.Contains(t, out, "\n  --units K\n")
			case "barrier":
				assert.Contains(t, out, "\n  -n N\n")
				assert.NotContains(t, out, "--try", "a barrier has no try")
			case "latch":
				assert.Contains(t, out, "\n  --set N\n")
				assert.Contains(t, out, "\n  --as ID\n")
			}
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}} {
		p := h.run(t, environ(), args...)
		assert.Equal(t, 0, p.code)
		assert.Contains(t, p.stdout.text(), "Exit status:")
	}
}

// testUnreachableEtcd: an etcd that does not answer within --dial-timeout is exit 69, one line.
func testUnreachableEtcd(t *testing.T, h *harness) {
	for _, args := range [][]string{
		{"lock", "--endpoints", "127.0.0.1:1", "--dial-timeout", "300ms", "cmd-unreachable", "--", "true"},
		{"status", "--endpoints", "127.0.0.1:1", "--command-timeout", "300ms", "cmd-unreachable"},
		{"status", "--watch", "--endpoints", "127.0.0.1:1", "--command-timeout", "300ms", "cmd-unreachable"},
	} {
		p := h.run(t, environ(), args...)
		assert.Equal(t, exitEtcd, p.code, "%q: %s", args, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync "+args[0]+": ")
	}
}

// testConnectionFlagsFirst: etcd's connection flags may come before the command, as
// etcdctl's global flags do, and then count as the command's own: they override the
// environment (an unreachable ETCDCTL_ENDPOINTS here) as flags after the command do.
func testConnectionFlagsFirst(t *testing.T, h *harness) {
	const name = "cmd-flags-first"
	env := environ("ETCDCTL_ENDPOINTS=127.0.0.1:1")
	endpoints := strings.Join(cluster.Endpoints(), ",")
	p := h.run(t, env, "--endpoints", endpoints, "--dial-timeout", "5s", "lock", name, "--", "true")
	assert.Equal(t, 0, p.code, p.stderr.text())
	p = h.run(t, env, "--endpoints="+endpoints, "status", name)
	assert.Equal(t, 0, p.code, p.stderr.text())
	p = h.run(t, env, "--dial-timeout", "300ms", "lock", name, "--", "true")
	assert.Equal(t, exitEtcd, p.code, "the environment's endpoints, unreachable: %s", p.stderr.text())
	p = h.run(t, environ(), "--endpoints", endpoints, "--help")
	assert.Equal(t, 0, p.code)
	assert.Contains(t, p.stdout.text(), "may come before the command")
	nothingLeft(t, cluster.Client(t), "", name)
}

// manyNames are n distinct names.
func manyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "cmd-many-" + strconv.Itoa(i)
	}
	return names
}

// testTwoClustersIsExit69: endpoints of two different clusters are exit 69, one line that
// names both clusters' IDs, before any lease is taken on either. Both clusters are its own:
// the package's cluster has the leases of the tests that run beside it.
func testTwoClustersIsExit69(t *testing.T, h *harness) {
	etcdtest.OwnMembers(t)
	var clis []*clientv3.Client
	var endpoints []string
	for range 2 {
		c, err := etcdtest.NewEmbedded(1)
		require.NoError(t, err)
		t.Cleanup(c.Close)
		clis = append(clis, c.Client(t))
		endpoints = append(endpoints, c.Endpoints()[0])
	}
	p := h.run(t, environ(), "lock", "--endpoints", strings.Join(endpoints, ","), "cmd-two-clusters", "--", "true")
	assert.Equal(t, exitEtcd, p.code, p.stderr.text())
	assertOneLine(t, p.stderr.text(), "etcdsync lock: ")
	assert.Contains(t, p.stderr.text(), "the client's endpoints are members of different etcd clusters")
	for _, cli := range clis {
		resp, err := cli.Get(etcdtest.Context(t), "x", clientv3.WithCountOnly())
		require.NoError(t, err)
		assert.Contains(t, p.stderr.text(), fmt.Sprintf("cluster %x at ", resp.Header.ClusterId))
		leases, err := cli.Leases(etcdtest.Context(t))
		require.NoError(t, err)
		assert.Empty(t, leases.Leases)
	}
}
