//go:build unix

package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testLogin: --user user:password, or ETCDCTL_USER and ETCDCTL_PASSWORD, log in; a wrong
// password and a name outside the user's grant are exit 69, one line; --prefix within the
// grant works, for holds and for status.
func testLogin(t *testing.T, h *harness) {
	etcdtest.OwnMembers(t)
	c, err := etcdtest.NewEmbedded(1)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.NoError(t, c.EnableAuth(etcdtest.Context(t), etcdtest.Grants{}))
	root := c.ClientConfig()
	admin := c.Client(t)
	ctx := etcdtest.Context(t)
	_, err = admin.UserAdd(ctx, "bob", "bob-password")
	require.NoError(t, err)
	_, err = admin.RoleAdd(ctx, "bob")
	require.NoError(t, err)
	_, err = admin.RoleGrantPermission(ctx, "bob", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
	require.NoError(t, err)
	_, err = admin.UserGrantRole(ctx, "bob", "bob")
	require.NoError(t, err)

	endpoints := strings.Join(c.Endpoints(), ",")
	env := environ("ETCDCTL_ENDPOINTS="+endpoints, "ETCDSYNC_NAMESPACE=") // the last one counts: its own cluster, no namespace
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"--user", nil, []string{"lock", "--user", root.Username + ":" + root.Password, "login"}, 0},
		{"ETCDCTL_USER", []string{"ETCDCTL_USER=" + root.Username, "ETCDCTL_PASSWORD=" + root.Password}, []string{"lock", "login"}, 0},
		{"--user and --password", nil, []string{"sem", "-n", "2", "--user", "bob", "--password", "bob-password", "--prefix", "app/", "login"}, 0},
		{"a wrong password", nil, []string{"lock", "--user", "bob:wrong", "--prefix", "app/", "login"}, exitEtcd},
		{"outside the grant", nil, []string{"lock", "--user", "bob:bob-password", "login"}, exitEtcd},
		{"status outside the grant", nil, []string{"status", "--user", "bob:bob-password", "login"}, exitEtcd},
		{"status within the grant", nil, []string{"status", "--user", "bob:bob-password", "--prefix", "app/", "login"}, 0},
	} {
		args := tc.args
		if args[0] != "status" {
			args = append(args, "--", "true")
		}
		p := h.run(t, append(env, tc.env...), args...)
		assert.Equal(t, tc.want, p.code, "%s: %s", tc.name, p.stderr.text())
		if tc.want != 0 {
			assertOneLine(t, p.stderr.text(), "etcdsync "+args[0]+": ")
			t.Logf("%s: %s", tc.name, p.stderr.text())
		}
	}
	nothingLeft(t, admin, "", "login")
	nothingLeft(t, admin, "app/", "login")
}

// testTLS: --cert and --key, or ETCDCTL_CERT and ETCDCTL_KEY, present a client certificate to
// a member that requires one; without one, or with a --cacert that did not sign the member's
// certificate, it is exit 69, one line.
func testTLS(t *testing.T, h *harness) {
	etcdtest.OwnMembers(t)
	c, err := etcdtest.NewEmbedded(1, etcdtest.WithTLS())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	tlsCfg, err := c.TLSConfig(etcdtest.RootUser)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(tlsCfg.Certificates[0].PrivateKey)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsCfg.Certificates[0].Certificate[0]}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))

	env := environ("ETCDCTL_ENDPOINTS="+strings.Join(c.Endpoints(), ","), "ETCDSYNC_NAMESPACE=") // its own cluster, no namespace
	// The test CA's certificate is not on disk for us: the member's certificate is taken on trust.
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"--cert --key", nil, []string{"--cert", cert, "--key", key, "--insecure-skip-tls-verify"}, 0},
		{"ETCDCTL_CERT", []string{"ETCDCTL_CERT=" + cert, "ETCDCTL_KEY=" + key, "ETCDCTL_INSECURE_SKIP_TLS_VERIFY=true"}, nil, 0},
		{"no client certificate", nil, []string{"--insecure-skip-tls-verify", "--dial-timeout", "1s"}, exitEtcd},
		{"a --cacert that did not sign it", nil, []string{"--cacert", cert, "--cert", cert, "--key", key, "--dial-timeout", "1s"}, exitEtcd},
	} {
		p := h.run(t, append(env, tc.env...), append(append([]string{"lock"}, tc.args...), "tls", "--", "true")...)
		assert.Equal(t, tc.want, p.code, "%s: %s", tc.name, p.stderr.text())
		if tc.want != 0 {
			assertOneLine(t, p.stderr.text(), "etcdsync lock: ")
			t.Logf("%s: %s", tc.name, p.stderr.text())
		}
	}
	nothingLeft(t, c.Client(t), "", "tls")
}
