package rwmutex_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/etcdtest"
	"github.com/etcdsync/etcdsync/rwmutex"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func newRW(t *testing.T, cli *clientv3.Client, name string, opts ...rwmutex.Option) *rwmutex.RWMutex {
	t.Helper()
	rw, err := rwmutex.New(cli, name, opts...)
	require.NoError(t, err)
	return rw
}
