package etcdtest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTimeout bounds how long a member may take to serve, and a new cluster to elect a leader.
const startTimeout = 30 * time.Second

// Cluster is a running etcd: embedded members in this process, or an external cluster.
type Cluster struct {
	endpoints []string
	prefix    string    // every client's namespace on an external cluster: see Prefix
	members   []*member // nil for an external cluster
	processes bool      // the members are server processes (NewProcesses), not embedded
	closeOnce sync.Once
	cuts      sync.Mutex // serializes Partition, Heal and restarts: see applyCuts

	ca      *authority  // nil without WithTLS
	rootTLS *tls.Config // the client TLS of ClientConfig: a certificate of RootUser; nil without WithTLS

	backups []string // directories of Backup's copies, removed by Close
	jwtDir  string   // the directory of WithJWT's key, removed by Close

	auth      sync.Mutex
	passwords map[string]string // by user, set by EnableAuth on a cluster without TLS; under auth
}

// member is one embedded etcd. life serializes starting and stopping it; etcd is the
// running server, nil while the member is stopped. It listens for peers on peerListenURL and
// tells them peerURL: the same, or the URL of peerProxy, which forwards to it.
type member struct {
	name, dir                         string
	clientURL, peerURL, peerListenURL url.URL
	clientTLS                         transport.TLSInfo // empty without WithTLS
	authToken                         string            // etcd's --auth-token; "" for its default
	peerProxy                         *Proxy            // nil without WithPeerProxies
	authTokenTTL                      uint              // WithAuthTokenTTL's; 0 for etcd's default
	initialCluster                    string
	partitioned                       bool // by Partition; under Cluster.cuts

	life   sync.Mutex
	closed bool // by Cluster.Close; under life
	joined bool // has started once, so its data dir holds the cluster; under life
	etcd   atomic.Pointer[embed.Etcd]
	gate   *gate // in front of the running embedded member's handlers; under life

	// A member of NewProcesses: the server binary, its log, the cluster token, and the
	// running process (nil while stopped; under life).
	bin, logFile, token string
	proc                *process
}

// running reports whether the member runs. Under life.
func (m *member) running() bool { return m.etcd.Load() != nil || m.proc != nil }

// New starts an embedded cluster of size members (1 or 3; other sizes allowed) unless the
// environment variable ETCD_ENDPOINTS is set ("host:port,host:port"), in which case it returns
// an external cluster for those endpoints and starts nothing (size is then ignored).
func New(size int) (*Cluster, error) {
	if env := os.Getenv("ETCD_ENDPOINTS"); env != "" {
		return external(strings.Split(env, ","))
	}
	return NewEmbedded(size)
}

// OwnMembers marks a test that runs on members of its own only, never on the cluster that
// ETCD_ENDPOINTS names: in the short tier against such a cluster it is skipped, since it
// would run there exactly as it runs without ETCD_ENDPOINTS, and that run is for the tests
// on the cluster named.
func OwnMembers(t testing.TB) {
	t.Helper()
	if shortAgainstExternal() {
		t.Skip("runs on members of its own: not in the short tier against ETCD_ENDPOINTS")
	}
}

// shortAgainstExternal reports whether this is the short tier against the cluster that
// ETCD_ENDPOINTS names. Flags must be parsed.
func shortAgainstExternal() bool { return testing.Short() && os.Getenv("ETCD_ENDPOINTS") != "" }

// external returns the cluster at endpoints, given as "host:port" (http is assumed) or URLs.
func external(endpoints []string) (*Cluster, error) {
	c := &Cluster{prefix: runPrefix()}
	for _, ep := range endpoints {
		if ep = strings.TrimSpace(ep); ep == "" {
			continue
		}
		if !strings.Contains(ep, "://") {
			ep = "http://" + ep
		}
		c.endpoints = append(c.endpoints, ep)
	}
	if len(c.endpoints) == 0 {
		return nil, errors.New("etcdtest: ETCD_ENDPOINTS names no endpoint")
	}
	return c, nil
}

// NewEmbedded starts size embedded members in this process, whatever ETCD_ENDPOINTS says (for
// fault tests), and returns once every member serves and they agree on a leader. On error
// nothing is left running and the data directories and certificates are removed.
//
// The ports are picked free, then bound by the members a moment later: another process, or
// an outgoing connection of this one, may take one in between. The start is then tried
// again on other ports, up to portTries times in all.
func NewEmbedded(size int, opts ...Option) (*Cluster, error) {
	if size < 1 {
		return nil, fmt.Errorf("etcdtest: cluster of %d members", size)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	for try := 1; ; try++ {
		c, err := newEmbedded(size, o)
		if err == nil || try == portTries || !portTaken(err) {
			return c, err
		}
	}
}

// portTries is how many times NewEmbedded picks ports when one is taken before it binds.
const portTries = 5

// portTaken reports whether err says a port was in use when a member or proxy bound it.
func portTaken(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func newEmbedded(size int, o options) (*Cluster, error) {
	ports, err := freePorts(2 * size)
	if err != nil {
		return nil, err
	}
	c := &Cluster{members: make([]*member, size)}
	var clientTLS transport.TLSInfo
	clientScheme := "http"
	if o.tls {
		if clientTLS, err = c.makeAuthority(); err != nil {
			c.Close()
			return nil, err
		}
		clientScheme = "https"
	}
	authToken := ""
	if o.jwt {
		if authToken, err = c.makeJWTKey(); err != nil {
			c.Close()
			return nil, err
		}
	}
	initial := make([]string, size)
	for i := range c.members {
		dir, err := os.MkdirTemp("", fmt.Sprintf("etcdtest-m%d-", i))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("etcdtest: data dir: %w", err)
		}
		m := &member{
			name:          fmt.Sprintf("m%d", i),
			dir:           dir,
			clientURL:     url.URL{Scheme: clientScheme, Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])},
			clientTLS:     clientTLS,
			authToken:     authToken,
			peerListenURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])},
			authTokenTTL:  o.authTokenTTL,
		}
		m.peerURL = m.peerListenURL
		c.members[i] = m
		if o.peerProxies {
			if m.peerProxy, err = NewProxy(m.peerListenURL); err != nil {
				c.Close()
				return nil, err
			}
			m.peerURL = m.peerProxy.URL()
		}
		c.endpoints = append(c.endpoints, m.clientURL.String())
		initial[i] = m.name + "=" + m.peerURL.String()
	}
	if err := c.startNew(initial); err != nil {
		return nil, err
	}
	return c, nil
}

// startNew starts the members of a new cluster, whose peers are initial, together (they wait
// for each other before they serve) and waits for them to agree on a leader; on error it
// closes the cluster.
func (c *Cluster) startNew(initial []string) error {
	for _, m := range c.members {
		m.initialCluster = strings.Join(initial, ",")
	}
	indices := make([]int, len(c.members))
	for i := range indices {
		indices[i] = i
	}
	if err := c.RestartAll(indices...); err != nil {
		c.Close()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.WaitLeader(ctx); err != nil {
		c.Close()
		return err
	}
	return nil
}

// makeAuthority makes the cluster's CA in a directory of its own, which Close removes, and
// returns the members' TLS settings for their clients.
func (c *Cluster) makeAuthority() (transport.TLSInfo, error) {
	dir, err := os.MkdirTemp("", "etcdtest-tls-")
	if err != nil {
		return transport.TLSInfo{}, fmt.Errorf("etcdtest: TLS dir: %w", err)
	}
	ca, err := newAuthority(dir)
	if err != nil {
		os.RemoveAll(dir)
		return transport.TLSInfo{}, err
	}
	c.ca = ca // Close removes dir from here on
	if c.rootTLS, err = ca.tlsConfig(RootUser); err != nil {
		return transport.TLSInfo{}, err
	}
	return ca.serverTLS()
}

// makeJWTKey writes the cluster's HS256 key into a directory of its own, which Close
// removes, and returns the members' --auth-token.
func (c *Cluster) makeJWTKey() (string, error) {
	dir, err := os.MkdirTemp("", "etcdtest-jwt-")
	if err != nil {
		return "", fmt.Errorf("etcdtest: JWT dir: %w", err)
	}
	c.jwtDir = dir
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	file := filepath.Join(dir, "jwt.key")
	if err := os.WriteFile(file, key, 0o600); err != nil {
		return "", fmt.Errorf("etcdtest: JWT key: %w", err)
	}
	return "jwt,sign-method=HS256,priv-key=" + file, nil
}

// lowSnapshotCount is the embedded members' SnapshotCount and SnapshotCatchUpEntries.
const lowSnapshotCount = 2000

// config is a fresh configuration for the member: embed.StartEtcd keeps state in the
// Config it is given (its logger), so every start gets its own.
func (m *member) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = m.name, m.dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{m.clientURL}, []url.URL{m.clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{m.peerListenURL}, []url.URL{m.peerURL}
	cfg.InitialCluster = m.initialCluster
	if m.joined {
		// Ignored anyway once the data dir holds a WAL, which it does after the first start.
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.ClientTLSInfo = m.clientTLS
	if m.authToken != "" {
		cfg.AuthToken = m.authToken
	}
	if m.authTokenTTL > 0 {
		cfg.AuthTokenTTL = m.authTokenTTL
	}
	cfg.UnsafeNoFsync = true
	// A member keeps the raft log in memory back to its last snapshot plus the catch-up
	// entries: with etcd's defaults (10,000 + 5,000) and the tests' large background values
	// (128-256 KiB, to make followers lag), that is up to 2 GB per member. A snapshot every
	// 2,000 entries, keeping 2,000 for a follower to catch up from (several seconds of those
	// writes, longer than any partition or stop a test makes), bounds it to a fifth.
	cfg.SnapshotCount = lowSnapshotCount
	cfg.SnapshotCatchUpEntries = lowSnapshotCount
	cfg.BcryptCost = 4 // bcrypt.MinCost: test passwords need no strength, and a login then costs no 50 ms hash
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.EnableGRPCGateway = false // the HTTP/JSON gateway: a loopback gRPC client we do not need
	return cfg
}

// start starts the stopped member and returns once it serves.
func (m *member) start() error {
	m.life.Lock()
	defer m.life.Unlock()
	switch {
	case m.closed:
		return fmt.Errorf("etcdtest: start %s: cluster closed", m.name)
	case m.running():
		return fmt.Errorf("etcdtest: start %s: already running", m.name)
	case m.bin != "":
		return m.startProcess()
	}
	cfg := m.config()
	m.gate = newGate()
	cfg.GRPCAdditionalServerOptions = append(cfg.GRPCAdditionalServerOptions, m.gate.serverOptions()...)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	}
	m.joined = true
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		m.etcd.Store(e)
		embeddedRunning.Add(1)
		return nil
	case err = <-e.Err():
	case <-e.Server.StopNotify():
		err = errors.New("server stopped")
	case <-timer.C:
		err = fmt.Errorf("not ready after %v", startTimeout)
	}
	shutdown(e, true)
	return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
}

// stop stops the member if it runs: see shutdown.
func (m *member) stop(hard bool) {
	m.life.Lock()
	defer m.life.Unlock()
	if e := m.etcd.Swap(nil); e != nil {
		defer embeddedRunning.Add(-1)
		if hard {
			m.gate.close() // see gate
		}
		shutdown(e, hard)
	}
	if p := m.proc; p != nil {
		m.proc = nil
		if hard {
			p.signal(syscall.SIGKILL)
		} else {
			p.signal(syscall.SIGTERM)
		}
	}
}

// embeddedRunning counts the embedded members running in the process, of every cluster.
var embeddedRunning atomic.Int64

// shutdown stops e. Gracefully, Close drains the client servers, then hands leadership over
// if e leads (waiting up to the request timeout) and stops raft. Hard, HardStop first stops
// raft and its transport at once, without telling anyone, so that Close finds no peer to hand
// leadership to. HardStop is also what lets Close end for a server that never became ready:
// Close waits for the client servers, which wait for the server to be ready or stopping.
func shutdown(e *embed.Etcd, hard bool) {
	if hard {
		e.Server.HardStop()
	}
	e.Close()
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: free port: %w", err)
		}
		defer l.Close() // held until all are taken, so that they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// External reports whether the cluster was started by someone else (ETCD_ENDPOINTS): its
// members cannot be stopped, killed or restarted.
func (c *Cluster) External() bool { return c.members == nil }

// Endpoints returns the client URLs of all members ("http://127.0.0.1:port", https with
// WithTLS), in member order.
func (c *Cluster) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// MemberEndpoint returns the client URL of embedded member i; it panics on an external cluster.
func (c *Cluster) MemberEndpoint(i int) string {
	c.member(i)
	return c.endpoints[i]
}

// Size returns the number of members: of endpoints, for an external cluster.
func (c *Cluster) Size() int { return len(c.endpoints) }

// ClientConfig returns a client configuration for all endpoints with a 5 s dial timeout and a
// no-op logger, so that callers may add DialOptions or interceptors, and the credentials of
// the root user, if the cluster needs any: on a WithTLS cluster a TLS configuration with a
// certificate whose CommonName is RootUser (a copy, callers may change it); on a cluster
// without TLS, once EnableAuth has run, root's user name and password.
func (c *Cluster) ClientConfig() clientv3.Config {
	cfg := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if c.rootTLS != nil {
		cfg.TLS = c.rootTLS.Clone()
	}
	c.auth.Lock()
	defer c.auth.Unlock()
	if pw, ok := c.passwords[RootUser]; ok {
		cfg.Username, cfg.Password = RootUser, pw
	}
	return cfg
}

// NewClient opens a new client on ClientConfig() (see Open); the caller closes it.
func (c *Cluster) NewClient() (*clientv3.Client, error) {
	return c.Open(c.ClientConfig())
}

// Open opens a client on cfg (ClientConfig, changed by the caller) whose keys and watches are
// inside Prefix: on an external cluster every test's client works in a namespace of its own
// run. The caller closes it.
func (c *Cluster) Open(cfg clientv3.Config) (*clientv3.Client, error) {
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: client: %w", err)
	}
	if c.prefix != "" {
		Confine(cli, c.prefix)
	}
	return cli, nil
}

// Client opens a new client on ClientConfig() and closes it in tb.Cleanup; it fails tb if it
// cannot open one.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return c.openFor(tb, c.ClientConfig())
}

// member returns embedded member i, or panics on an external cluster.
func (c *Cluster) member(i int) *member {
	if c.External() {
		panic("etcdtest: the members of an external cluster (ETCD_ENDPOINTS) cannot be addressed, stopped or restarted; check External() first")
	}
	if i < 0 || i >= len(c.members) {
		panic(fmt.Sprintf("etcdtest: no member %d in a cluster of %d", i, len(c.members)))
	}
	return c.members[i]
}

// Stop stops member i gracefully (embed.Etcd.Close): it drains its clients and, if it leads,
// transfers leadership first. Stopping a stopped member does nothing. It panics on an
// external cluster.
func (c *Cluster) Stop(i int) { c.member(i).stop(false) }

// Kill stops member i hard, as a crash would as far as the other members can tell: raft and
// its peer connections stop at once, with no leadership transfer (EtcdServer.HardStop); then
// its listeners and client streams close (embed.Etcd.Close). Killing a stopped member does
// nothing. It panics on an external cluster.
func (c *Cluster) Kill(i int) { c.member(i).stop(true) }

// Restart starts stopped or killed member i again with its data dir and URLs, and returns
// once it serves (it has rejoined the cluster), or with an error after about 30 s. Once it
// serves, partitions in place apply to it too; a partitioned member itself cannot restart,
// as serving takes its peers. It panics on an external cluster.
func (c *Cluster) Restart(i int) error {
	m := c.member(i)
	if m.peerProxy == nil {
		return m.start()
	}
	err := m.start()
	c.cuts.Lock()
	defer c.cuts.Unlock()
	c.applyCuts()
	return err
}

// RestartAll restarts the stopped members at once (see Restart), and returns once all serve:
// after a majority was down, a member restarted alone waits for a peer to form a quorum with.
func (c *Cluster) RestartAll(members ...int) error {
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for j, i := range members {
		wg.Go(func() { errs[j] = c.Restart(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Leader returns the index of the leader, waiting until ctx ends for the members to agree on
// one: every running embedded member, or every endpoint that answers a Status call on an
// external cluster, names the same leader, which is one of them.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	view := c.embeddedView
	if c.External() || c.processes {
		cli, err := c.NewClient()
		if err != nil {
			return -1, err
		}
		defer cli.Close()
		view = func(ctx context.Context, i int) (self, lead uint64, ok bool) {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := cli.Status(ctx, c.endpoints[i])
			if err != nil {
				return 0, 0, false
			}
			return st.Header.MemberId, st.Leader, true
		}
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if i := c.agreedLeader(ctx, view); i >= 0 {
			return i, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return -1, fmt.Errorf("etcdtest: no leader: %w", ctx.Err())
		}
	}
}

// WaitLeader waits until ctx ends for the running members to agree on a leader, as Leader.
func (c *Cluster) WaitLeader(ctx context.Context) error {
	_, err := c.Leader(ctx)
	return err
}

// embeddedView returns member i's ID and the leader it follows; ok is false if it is stopped.
func (c *Cluster) embeddedView(_ context.Context, i int) (self, lead uint64, ok bool) {
	e := c.members[i].etcd.Load()
	if e == nil {
		return 0, 0, false
	}
	return uint64(e.Server.MemberID()), uint64(e.Server.Leader()), true
}

// agreedLeader returns the index of the leader every member in view names, or -1.
func (c *Cluster) agreedLeader(ctx context.Context, view func(context.Context, int) (self, lead uint64, ok bool)) int {
	leader, lead := -1, uint64(0)
	for i := range c.endpoints {
		self, l, ok := view(ctx, i)
		switch {
		case !ok:
			continue
		case l == 0 || (lead != 0 && l != lead):
			return -1
		}
		lead = l
		if self == l {
			leader = i
		}
	}
	return leader
}

// Close stops every embedded member, then their peer proxies, and removes their data dirs
// and, with WithTLS, the certificates; on an external cluster it deletes every key under
// Prefix. It is safe to call twice.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		if c.External() {
			c.sweep()
			return
		}
		// Every member's gate first, and then no receive loop of etcd's streams left (see
		// awaitStreamLoops): only then is any backend closed.
		var gates sync.WaitGroup
		var running int64
		for _, m := range c.members {
			if m == nil {
				continue
			}
			m.life.Lock()
			g := m.gate
			up := m.etcd.Load() != nil
			m.life.Unlock()
			if up && g != nil {
				running++
				gates.Go(g.close)
			}
		}
		gates.Wait()
		if running > 0 && embeddedRunning.Load() == running {
			awaitStreamLoops(gateDrain) // no other cluster's streams in the process to wait for
		}
		// Hard: a graceful stop of a leader would try to hand leadership to members that are
		// stopping too, and wait for that.
		var wg sync.WaitGroup
		for _, m := range c.members {
			if m == nil {
				continue
			}
			wg.Go(func() {
				m.life.Lock()
				m.closed = true
				m.life.Unlock()
				m.stop(true)
				os.RemoveAll(m.dir)
				if m.bin != "" {
					os.RemoveAll(filepath.Dir(m.dir)) // the process's log beside it
				}
			})
		}
		wg.Wait()
		// Only now: a proxy's Close waits for the connections through it, which the members
		// held open.
		for _, m := range c.members {
			if m != nil && m.peerProxy != nil {
				m.peerProxy.Close()
			}
		}
		if c.ca != nil {
			os.RemoveAll(c.ca.dir)
		}
		for _, dir := range c.backups {
			os.RemoveAll(dir)
		}
		if c.jwtDir != "" {
			os.RemoveAll(c.jwtDir)
		}
	})
}
