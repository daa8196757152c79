package etcdtest

import (
	"fmt"
	"net/url"
	"sync/atomic"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Proxy forwards the TCP connections made to its URL to a target address through etcd's own
// fault-injecting proxy (go.etcd.io/etcd/pkg/v3/proxy), so that a test can black-hole the
// traffic and restore it.
type Proxy struct {
	srv        proxy.Server
	url        url.URL
	blackholed atomic.Bool
	drained    chan struct{} // closed once the error drain has ended, after Close
}

// NewProxy starts a proxy on a free loopback port that forwards to target ("http://host:port").
// The caller closes it.
func NewProxy(target url.URL) (*Proxy, error) {
	var lastErr error
	for range 3 { // the free port may be taken by someone else before the proxy listens on it
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		from := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
		srv := proxy.NewServer(proxy.ServerConfig{Logger: zap.NewNop(), From: from, To: target})
		select {
		case <-srv.Ready():
			p := &Proxy{srv: srv, url: from, drained: make(chan struct{})}
			go p.drainErrors()
			return p, nil
		case <-srv.Done(): // it could not listen, and said why on Error
			select {
			case lastErr = <-srv.Error():
			default:
				lastErr = fmt.Errorf("proxy to %s closed at start", target.Host)
			}
		}
	}
	return nil, fmt.Errorf("etcdtest: proxy to %s: %w", target.Host, lastErr)
}

// drainErrors empties the proxy's error channel until Close: its connection goroutines block
// on that channel once it holds 16 errors (every failed dial of a stopped target is one).
func (p *Proxy) drainErrors() {
	defer close(p.drained)
	for {
		select {
		case <-p.srv.Error():
		case <-p.srv.Done():
			return
		}
	}
}

// URL is where the proxy listens: "http://127.0.0.1:port".
func (p *Proxy) URL() url.URL { return p.url }

// Blackhole drops every byte in both directions, on open and new connections alike, while
// keeping the connections open: the peers see silence, not a reset, as with a network
// partition, and notice only by their own timeouts.
func (p *Proxy) Blackhole() {
	p.srv.BlackholeTx()
	p.srv.BlackholeRx()
	p.blackholed.Store(true)
}

// Restore forwards traffic again. Connections that lost bytes meanwhile are garbled: the
// peers close them on the first protocol error or timeout, and reconnect.
func (p *Proxy) Restore() {
	p.srv.UnblackholeTx()
	p.srv.UnblackholeRx()
	p.blackholed.Store(false)
}

// Pause holds every byte in both directions, on open and new connections alike, until
// Resume: the peers see silence, as with Blackhole, but nothing is lost, so a connection
// that survives the pause goes on intact (and a request held in it reaches the server
// late), and one that a peer gave up is closed cleanly. Blackhole, by dropping bytes in the
// middle of HTTP/2 frames, can leave a connection that gRPC keeps using while the server
// resets every stream on it, which no real network does.
func (p *Proxy) Pause() {
	p.srv.PauseTx()
	p.srv.PauseRx()
}

// Resume undoes Pause.
func (p *Proxy) Resume() {
	p.srv.UnpauseTx()
	p.srv.UnpauseRx()
}

// Blackholed reports whether traffic is being dropped.
func (p *Proxy) Blackholed() bool { return p.blackholed.Load() }

// Close stops listening and returns once every proxied connection has ended: close the
// endpoints of those connections (clients, members) first, or Close waits for them.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	<-p.drained
	return err
}
