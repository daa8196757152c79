package mutex_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func newMutex(t *testing.T, cli *clientv3.Client, name string, opts ...mutex.Option) *mutex.Mutex {
	t.Helper()
	m, err := mutex.New(cli, name, opts...)
	require.NoError(t, err)
	return m
}
