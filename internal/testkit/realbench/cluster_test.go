package realbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// processSizes are the clusters of server processes the benchmarks start themselves.
var processSizes = []int{1, 3}

// clusters holds the clusters started so far, shared by every benchmark of the run and
// closed by TestMain: a cluster of 3 processes takes seconds to start.
var clusters struct {
	sync.Mutex
	bySize map[int]*etcdtest.Cluster // by members; the external cluster under its size
}

// clusterOf returns the cluster of size members, starting it on first use: with
// ETCD_ENDPOINTS set, the external cluster whatever size is.
func clusterOf(b *testing.B, size int) *etcdtest.Cluster {
	b.Helper()
	clusters.Lock()
	defer clusters.Unlock()
	if c := clusters.bySize[size]; c != nil {
		return c
	}
	var c *etcdtest.Cluster
	var err error
	if os.Getenv("ETCD_ENDPOINTS") != "" {
		c, err = etcdtest.New(size) // external: starts nothing
	} else {
		c, err = etcdtest.NewProcesses(size, etcdtest.ServerBinary())
	}
	if err != nil {
		b.Fatalf("realbench: cluster of %d: %v", size, err)
	}
	if clusters.bySize == nil {
		clusters.bySize = map[int]*etcdtest.Cluster{}
	}
	clusters.bySize[size] = c
	return c
}

func closeClusters() {
	clusters.Lock()
	defer clusters.Unlock()
	for size, c := range clusters.bySize {
		c.Close()
		delete(clusters.bySize, size)
	}
}

// forEachCluster runs bench as a sub-benchmark "members=N" on each cluster: the external
// one (ETCD_ENDPOINTS), or processes of 1 and 3 members; it skips b if there is neither.
func forEachCluster(b *testing.B, bench func(b *testing.B, on *target)) {
	if env := os.Getenv("ETCD_ENDPOINTS"); env != "" {
		c := clusterOf(b, 0)
		b.Run(fmt.Sprintf("members=%d", c.Size()), func(b *testing.B) { bench(b, newTarget(b, c)) })
		return
	}
	if etcdtest.ServerBinary() == "" {
		b.Skip("realbench needs real etcd servers: set ETCD_ENDPOINTS, or put etcd on PATH (or name it in ETCDTEST_ETCD)")
	}
	for _, size := range processSizes {
		b.Run(fmt.Sprintf("members=%d", size), func(b *testing.B) { bench(b, newTarget(b, clusterOf(b, size))) })
	}
}

// target is one sub-benchmark's view of a cluster: where its keys go and which member leads.
type target struct {
	cluster *etcdtest.Cluster
	root    string // every key of the sub-benchmark is under it; deleted at its end
	leader  int    // the member that led at the start
	metrics *scraper
}

// newTarget finds the leader and picks a fresh root under the cluster's prefix (the run's
// own on an external cluster), whose keys it deletes when b ends.
func newTarget(b *testing.B, c *etcdtest.Cluster) *target {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		b.Fatalf("realbench: %v", err)
	}
	var tag [6]byte
	_, _ = rand.Read(tag[:])
	cfg := plainConfig(c, c.Endpoints())
	tr := &http.Transport{TLSClientConfig: cfg.TLS}
	b.Cleanup(tr.CloseIdleConnections)
	t := &target{
		cluster: c,
		root:    c.Prefix() + "realbench-" + hex.EncodeToString(tag[:]) + "/",
		leader:  leader,
		metrics: newScraper(c.Endpoints(), tr),
	}
	b.Cleanup(func() { // registered first, so it runs after every client and session has closed
		if _, err := etcdtest.DeletePrefix(cfg, t.root); err != nil {
			b.Errorf("realbench: delete %s: %v", t.root, err)
		}
	})
	return t
}

// plainConfig is a configuration for endpoints with the cluster's credentials and no
// namespace: the benchmarks put their keys under a root of their own, so that no client is
// wrapped (a wrapped client takes a slower path in our core).
func plainConfig(c *etcdtest.Cluster, endpoints []string) clientv3.Config {
	cfg := c.ClientConfig()
	cfg.Endpoints = endpoints
	cfg.Logger = zap.NewNop()
	return cfg
}

// spread returns the endpoints of n clients spread over members: client i's is member
// i modulo their number, alone.
func spread(endpoints []string, n int) [][]string {
	out := make([][]string, n)
	for i := range out {
		out[i] = []string{endpoints[i%len(endpoints)]}
	}
	return out
}

// counted is a client whose RPCs its counter counts, and whose unary calls under way
// pending counts.
type counted struct {
	*clientv3.Client
	cnt     *rpcstat.Counter
	pending *atomic.Int64
}

// pendingCalls is a dial option that counts the unary calls under way in n.
func pendingCalls(n *atomic.Int64) grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		defer n.Add(-1)
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

// clients opens n counted clients spread over the members (see spread), the first on
// member first; they close when b ends.
func (t *target) clients(b *testing.B, n, first int) []counted {
	b.Helper()
	eps := t.cluster.Endpoints()
	eps = append(eps[first%len(eps):], eps[:first%len(eps)]...)
	out := make([]counted, n)
	for i, pinned := range spread(eps, n) {
		cnt, pending := &rpcstat.Counter{}, &atomic.Int64{}
		cfg := plainConfig(t.cluster, pinned)
		cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
		cfg.DialOptions = append(cfg.DialOptions, pendingCalls(pending))
		cli, err := clientv3.New(cfg)
		if err != nil {
			b.Fatalf("realbench: client of %v: %v", pinned, err)
		}
		b.Cleanup(func() { cli.Close() })
		out[i] = counted{cli, cnt, pending}
	}
	return out
}

// countsOf adds up the counts of the clients so far.
func countsOf(clients []counted) rpcstat.Counts {
	sum := rpcstat.Counts{}
	for _, c := range clients {
		sum.Add(c.cnt.Counts())
	}
	return sum
}
