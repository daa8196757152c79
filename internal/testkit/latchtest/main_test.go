package latch_test

import (
	"context"
	"sync"
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

// watching returns a client of the cluster and a channel closed once the client opens
// its first watch stream: an Await on it has read the latch then, and watches it from the
// revision after that read. The stream opens once until closes (at once if nil), as the
// watch of a client that was cut off does when it is back.
func watching(t *testing.T, until <-chan struct{}) (*clientv3.Client, <-chan struct{}) {
	t.Helper()
	opened := make(chan struct{})
	var once sync.Once
	inj := &etcdtest.Injector{}
	rule := etcdtest.Rule{Method: "Watch", Action: etcdtest.Delay, Matched: func() { once.Do(func() { close(opened) }) }}
	if until != nil {
		rule.Action, rule.Until = etcdtest.Hold, until
	}
	inj.Add(rule)
	return inj.Client(t, cluster), opened
}
