package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestALossToExpiredAuthTokensNamesTheAuthentication: against etcd 3.4 with simple tokens
// that expire (after 1 s unused) before the renewals come (every 2 s), clientv3 cannot log
// in again and every renewal gets no answer in time. The hold is lost at its local deadline,
// and its loss names etcd's refusal of the token, not "no answer in time". It needs the
// etcd 3.4 server binary (Debian's /usr/bin/etcd, or ETCD_BIN): the embedded 3.7 members
// take a new login with an expired token.
func TestALossToExpiredAuthTokensNamesTheAuthentication(t *testing.T) {
	etcdtest.OwnMembers(t)
	bin := etcdtest.ServerBinary()
	if bin == "" {
		t.Skip("no etcd server binary")
	}
	c, err := etcdtest.NewProcesses(1, bin, etcdtest.WithAuthTokenTTL(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.NoError(t, c.EnableAuth(testContext(t), etcdtest.Grants{"app": {""}}))
	cli := c.ClientWithPassword(t, "app")
	h, err := queue(t, cli, "auth-token-expiry", core.WithTTL(6*time.Second)).Acquire(testContext(t), exclusive, nil)
	require.NoError(t, err)
	etcdtest.Within(t, h.Done(), 20*time.Second, "the loss")
	require.ErrorIs(t, h.Err(), core.ErrLost)
	assert.Contains(t, h.Err().Error(), "local deadline")
	assert.Contains(t, h.Err().Error(), "invalid auth token")
	assert.NotContains(t, h.Err().Error(), "no answer in time")
}
