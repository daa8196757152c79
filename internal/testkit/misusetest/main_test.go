package misusetest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// doneContext is a context cancelled already.
func doneContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// closedClient is a client of the cluster that is closed already.
func closedClient(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := cluster.NewClient()
	require.NoError(t, err)
	require.NoError(t, cli.Close())
	return cli
}
