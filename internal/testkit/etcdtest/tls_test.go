package etcdtest

import (
	"context"
	"crypto/tls"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// refusalWait bounds a request that the cluster must refuse: a client keeps retrying a
// refused handshake until its context ends.
const refusalWait = time.Second

// TestTLS starts one WithTLS member and checks, in order, what it serves and to whom; the
// last step turns auth on.
func TestTLS(t *testing.T) {
	c, err := NewEmbedded(1, WithTLS())
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("ServesHTTPS", func(t *testing.T) {
		for _, ep := range c.Endpoints() {
			assert.True(t, strings.HasPrefix(ep, "https://"), ep)
		}
	})
	t.Run("ServesClientsWithACertificateOfItsCA", func(t *testing.T) {
		for name, cli := range map[string]*clientv3.Client{
			"Client":       c.Client(t),
			"PinnedClient": PinnedClient(t, c, 0),
			"SpreadClient": SpreadClient(t, c, 0),
			"ClientAs":     c.ClientAs(t, "someone"),
		} {
			_, err := cli.Put(ctx, "etcdtest/tls/"+name, "v")
			assert.NoError(t, err, name)
		}
	})
	t.Run("RefusesClientWithoutCertificate", func(t *testing.T) {
		cfg, err := c.TLSConfig(RootUser)
		require.NoError(t, err)
		cfg.Certificates = nil
		assertRefused(t, c, cfg)
	})
	t.Run("RefusesCertificateOfAnotherCA", func(t *testing.T) {
		other, err := newAuthority(t.TempDir())
		require.NoError(t, err)
		foreign, err := other.clientCert(RootUser)
		require.NoError(t, err)
		cfg, err := c.TLSConfig(RootUser)
		require.NoError(t, err)
		cfg.Certificates = []tls.Certificate{foreign}
		assertRefused(t, c, cfg)
	})
	t.Run("EnableAuthRestrictsUserToItsPrefixes", func(t *testing.T) {
		require.NoError(t, c.EnableAuth(ctx, Grants{"app": {"app/"}}))
		app := c.ClientAs(t, "app")
		_, err := app.Put(ctx, "app/x", "v")
		assert.NoError(t, err, "inside the grant")
		_, err = app.Put(ctx, "other/x", "v")
		assert.ErrorIs(t, err, rpctypes.ErrPermissionDenied, "outside the grant")
		_, err = app.Get(ctx, "etcdtest/tls/Client")
		assert.ErrorIs(t, err, rpctypes.ErrPermissionDenied, "read outside the grant")
		_, err = c.ClientAs(t, "stranger").Get(ctx, "app/x")
		assert.Error(t, err, "a certificate of a user etcd does not know")
		resp, err := c.Client(t).Get(ctx, "other/x")
		require.NoError(t, err, "root")
		assert.Empty(t, resp.Kvs)
	})

	dir := c.ca.dir
	c.Close()
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "Close left the certificates at %s: %v", dir, err)
}

// assertRefused checks that c's member refuses a TLS connection with cfg, saying why in a
// TLS alert, and that a client with cfg gets no answer.
func assertRefused(t *testing.T, c *Cluster, cfg *tls.Config) {
	t.Helper()
	u, err := url.Parse(c.MemberEndpoint(0))
	require.NoError(t, err)
	conn, err := tls.Dial("tcp", u.Host, cfg)
	if err == nil { // TLS 1.3: the server checks the client's certificate after the handshake
		defer conn.Close()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(refusalWait)))
		_, err = conn.Read(make([]byte, 1))
	}
	assert.ErrorContains(t, err, "remote error: tls:")

	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: refusalWait, Logger: zap.NewNop(), TLS: cfg})
	require.NoError(t, err, "the client dials in the background")
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), refusalWait)
	defer cancel()
	_, err = cli.Put(ctx, "etcdtest/tls/refused", "v")
	assert.Error(t, err)
}

// TestEnableAuthWithPasswords turns auth on in a cluster without TLS: users log in with the
// passwords it made, root through ClientConfig, and each may write only under its prefixes.
func TestEnableAuthWithPasswords(t *testing.T) {
	c, err := NewEmbedded(1)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.EnableAuth(ctx, Grants{"app": {"app/"}, "all": {""}}))

	app := c.ClientWithPassword(t, "app")
	_, err = app.Put(ctx, "app/x", "v")
	assert.NoError(t, err)
	_, err = app.Put(ctx, "other/x", "v")
	assert.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
	_, err = c.ClientWithPassword(t, "all").Put(ctx, "other/x", "v")
	assert.NoError(t, err, "the empty prefix grants every key")
	_, err = c.Client(t).AuthStatus(ctx)
	assert.NoError(t, err, "root")
	_, err = ClientOf(t, c.Endpoints()...).Put(ctx, "app/y", "v")
	assert.ErrorIs(t, err, rpctypes.ErrUserEmpty, "no user")
}
