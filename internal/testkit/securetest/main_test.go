package securetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// cluster is one member serving TLS with client certificates required, and with auth on:
// user root (ClientConfig's certificate, so cluster.Client), and the users of grants.
var cluster *etcdtest.Cluster

// The users of the tests, each with its own grant.
const (
	appUser    = "app"       // READWRITE on appPrefix
	tenantUser = "tenant"    // READWRITE on tenantPrefix: the namespace of the namespaced clients
	splitUser  = "split"     // READWRITE on the kinds of splitRW and splitSem, not on their names
	revocable  = "revocable" // READWRITE on revocablePrefix, which tests revoke and grant again
	nameUser   = "named"     // READWRITE on the keys of namedElection alone, not beside them
)

// namedElection is the election of nameUser, under appPrefix.
const namedElection = "named-leader"

const (
	appPrefix       = "app/"
	tenantPrefix    = "tenant/"
	splitPrefix     = "split/"
	revocablePrefix = "revocable/"
	otherPrefix     = "other/" // granted to nobody but root
)

// The names that splitUser may take a part of: the sub-ranges their acquisitions write and
// read (the limit record's as a prefix that only it and its marker fall under), but not the
// whole name, which their waiters watch.
const (
	splitRW  = "reports"
	splitSem = "quota"
)

var grants = etcdtest.Grants{
	appUser:    {appPrefix},
	tenantUser: {tenantPrefix},
	revocable:  {revocablePrefix},
	nameUser:   {appPrefix + core.NamePrefix(namedElection)},
	splitUser: {
		splitPrefix + core.NamePrefix(splitRW) + core.KindRead,
		splitPrefix + core.NamePrefix(splitRW) + core.KindWrite,
		splitPrefix + core.NamePrefix(splitSem) + core.KindPermit,
		splitPrefix + core.NamePrefix(splitSem) + core.RecordLimit,
	},
}

// TestMain runs the tests against a secure cluster of its own, then checks with goleak that
// no goroutine outlived them: a call refused by etcd must leave no goroutine waiting.
func TestMain(m *testing.M) {
	etcdtest.MainWith(m, &cluster, func() (*etcdtest.Cluster, error) {
		c, err := etcdtest.NewEmbedded(1, etcdtest.WithTLS())
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.EnableAuth(ctx, grants); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
}
