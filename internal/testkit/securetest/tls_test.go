package securetest_test

import (
	"testing"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestTLSContention: over TLS with client certificates, two clients (root's certificate)
// contend for a name through every primitive: the second waits while the first holds and
// is served once it lets go, with a higher token, and no key is left.
func TestTLSContention(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			name := "tls-" + k.Name
			contend(t, k, side{cli: cluster.Client(t)}, side{cli: cluster.Client(t)}, cluster.Client(t), name, core.NamePrefix(name))
		})
	}
}

// TestTLSElection: over TLS, Campaign, Proclaim, Leader, Observe and Resign of two
// candidates on two clients.
func TestTLSElection(t *testing.T) {
	runElection(t, cluster.Client(t), cluster.Client(t), cluster.Client(t), "tls-election", core.NamePrefix("tls-election"))
}
