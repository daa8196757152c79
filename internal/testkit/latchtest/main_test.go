package latch_test

import (
	"context"
	"net/url"
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

// watching returns a client of the cluster, through a proxy of member 0 if proxied, and a
// channel closed once the client opens its first watch stream: an Await on it has read the
// latch and watches it from then on.
func watching(t *testing.T, proxied bool) (*clientv3.Client, *etcdtest.Proxy, <-chan struct{}) {
	t.Helper()
	opened := make(chan struct{})
	var once sync.Once
	inj := &etcdtest.Injector{}
	inj.Add(etcdtest.Rule{Method: "Watch", Action: etcdtest.Delay, Matched: func() { once.Do(func() { close(opened) }) }})
	if !proxied {
		return inj.Client(t, cluster), nil, opened
	}
	target, err := url.Parse(cluster.Endpoints()[0])
	require.NoError(t, err)
	proxy, err := etcdtest.NewProxy(*target)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	cfg := cluster.ClientConfig()
	through := proxy.URL()
	cfg.Endpoints = []string{through.String()}
	cfg.DialOptions = append(cfg.DialOptions, inj.DialOptions()...)
	cli, err := cluster.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli, proxy, opened
}
