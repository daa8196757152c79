package latch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newLatch returns a Latch on name, whose keys an earlier run (-count) left are deleted.
func newLatch(t *testing.T, cli *clientv3.Client, name string) *latch.Latch {
	t.Helper()
	l, err := latch.New(cli, name)
	require.NoError(t, err)
	return l
}

// fresh deletes what an earlier run left of name's latch.
func fresh(t *testing.T, name string) {
	t.Helper()
	_, err := cluster.Client(t).Delete(testContext(t), latchKeys(name), clientv3.WithPrefix())
	require.NoError(t, err)
}

// latchKeys is the prefix of every key of name's latch.
func latchKeys(name string) string { return core.NamePrefix(name) + "latch" }
