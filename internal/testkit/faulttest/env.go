package faulttest

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// Env is a 3-member embedded cluster whose members can be stopped, killed and partitioned
// (etcdtest.WithPeerProxies), with an admin client that talks to every member directly.
type Env struct {
	Cluster *etcdtest.Cluster
	Admin   *clientv3.Client
	// auth: the cluster runs with auth on and JWTs (NewAuthEnv), its clients as workerUser.
	auth  bool
	users atomic.Int64 // added by changeAuth
}

// workerUser is the user of the clients an Env with auth hands out.
const workerUser = "worker"

// NewEnv starts the cluster and closes it, and every client it hands out, in t.Cleanup.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	c, err := etcdtest.NewEmbedded(3, etcdtest.WithPeerProxies())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &Env{Cluster: c, Admin: c.Client(t)}
}

// Close closes the admin client and the cluster before t's cleanup would.
func (e *Env) Close() {
	e.Admin.Close()
	e.Cluster.Close()
}

// envs hands out one Env at a time, plain or with auth: asked for the other kind, it closes
// the one it has first, so that a run puts three members on the machine, not six.
type envs struct {
	t   testing.TB
	cur *Env
}

func (es *envs) get(auth bool) *Env {
	if es.cur != nil && es.cur.auth == auth {
		return es.cur
	}
	if es.cur != nil {
		es.cur.Close()
	}
	if auth {
		es.cur = NewAuthEnv(es.t)
	} else {
		es.cur = NewEnv(es.t)
	}
	return es.cur
}

// NewAuthEnv is NewEnv with auth on and JWTs (etcdtest.WithJWT): the clients it hands out
// log in as workerUser, who may read and write every key, so that a change to the auth
// store (see changeAuth) makes their tokens old, as in a cluster with auth; Admin is root.
//
// No fault may stop a member of it: an embedded etcd (3.7.3) that is stopping while it
// checks a watch's permission reads its closed backend and crashes the test process, and
// only with auth on does the check read the backend.
func NewAuthEnv(t testing.TB) *Env {
	t.Helper()
	c, err := etcdtest.NewEmbedded(3, etcdtest.WithPeerProxies(), etcdtest.WithJWT())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.EnableAuth(ctx, etcdtest.Grants{workerUser: {""}}); err != nil {
		t.Fatal(err)
	}
	return &Env{Cluster: c, Admin: c.Client(t), auth: true}
}

// changeAuth adds a user: a change to etcd's auth store, after which etcd refuses every
// token issued before it (clientv3 logs in again when a request is refused so), and every
// watch create on a stream opened with one. It returns the user's name.
func (e *Env) changeAuth(ctx context.Context) (string, error) {
	user := fmt.Sprintf("user-%d", e.users.Add(1))
	if _, err := e.Admin.UserAdd(ctx, user, "pw"); err != nil {
		return user, fmt.Errorf("faulttest: add user %s: %w", user, err)
	}
	return user, nil
}

// Client is an etcd client of the cluster through proxies of its own, so that its traffic
// alone can be black-holed.
type Client struct {
	*clientv3.Client
	Member  int // index of the member it talks to, or talks to first when Spread
	Spread  bool
	Inj     *etcdtest.Injector // disturbs its RPCs: without rules it lets every call through
	proxies []*etcdtest.Proxy
}

// Client returns a client of member alone through a new proxy, with a 1 s keep-alive time
// and timeout (a black-holed client notices within about 2 s) and reconnects tried at least
// every second. It is closed in t.Cleanup, client first, then its proxy.
func (e *Env) Client(t testing.TB, member int) *Client {
	t.Helper()
	return e.client(t, member, []int{member})
}

// SpreadClient is like Client, but talks to every member, member first, through a proxy
// each; its requests are balanced over them, so that a Txn and the watch that follows it
// are often served by different members, and the watch's member may not have applied the
// Txn yet: the fault of a lagging member.
func (e *Env) SpreadClient(t testing.TB, member int) *Client {
	t.Helper()
	order := make([]int, e.Cluster.Size())
	for i := range order {
		order[i] = (member + i) % len(order)
	}
	c := e.client(t, member, order)
	c.Spread = true
	return c
}

func (e *Env) client(t testing.TB, member int, members []int) *Client {
	t.Helper()
	c := &Client{Member: member, Inj: &etcdtest.Injector{}}
	closeProxies := func() {
		for _, p := range c.proxies {
			p.Close()
		}
	}
	cfg := e.Cluster.ClientConfig()
	if e.auth {
		var err error
		if cfg, err = e.Cluster.ConfigFor(workerUser); err != nil {
			closeProxies()
			t.Fatal(err)
		}
	}
	cfg.Endpoints = nil
	for _, m := range members {
		target, err := urlOf(e.Cluster.MemberEndpoint(m))
		if err != nil {
			closeProxies()
			t.Fatal(err)
		}
		p, err := etcdtest.NewProxy(target)
		if err != nil {
			closeProxies()
			t.Fatal(err)
		}
		c.proxies = append(c.proxies, p)
		u := p.URL()
		cfg.Endpoints = append(cfg.Endpoints, u.String())
	}
	cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout = time.Second, time.Second
	cfg.DialOptions = append(cfg.DialOptions, c.Inj.DialOptions()...)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithConnectParams(grpc.ConnectParams{
		// A connection attempt made while black-holed hangs until this timeout: keep it
		// short so the client reconnects soon after the traffic is restored.
		MinConnectTimeout: 2 * time.Second,
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	}))
	cli, err := clientv3.New(cfg)
	if err != nil {
		closeProxies()
		t.Fatalf("faulttest: client of members %v: %v", members, err)
	}
	t.Cleanup(func() {
		c.Inj.Settle()
		cli.Close()
		closeProxies()
	})
	c.Client = cli
	return c
}

// Blackhole drops the client's traffic both ways until Restore: to the client it looks as
// if the process were paused or the network gone; its lease is no longer renewed.
func (c *Client) Blackhole() {
	for _, p := range c.proxies {
		p.Blackhole()
	}
}

// Pause holds the client's traffic both ways until Resume, losing nothing (see
// etcdtest.Proxy.Pause): a network that stops delivering, then delivers again.
func (c *Client) Pause() {
	for _, p := range c.proxies {
		p.Pause()
	}
}

// Resume undoes Pause.
func (c *Client) Resume() {
	for _, p := range c.proxies {
		p.Resume()
	}
}

// Restore undoes Blackhole.
func (c *Client) Restore() {
	for _, p := range c.proxies {
		p.Restore()
	}
}

// leader returns the index of the leader, as all running members agree, within 30 s.
func (e *Env) leader(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	i, err := e.Cluster.Leader(ctx)
	if err != nil {
		return -1, fmt.Errorf("faulttest: %w", err)
	}
	return i, nil
}

func urlOf(s string) (url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return url.URL{}, fmt.Errorf("faulttest: endpoint %q: %w", s, err)
	}
	return *u, nil
}
