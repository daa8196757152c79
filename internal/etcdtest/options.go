package etcdtest

// Option configures an embedded cluster (NewEmbedded).
type Option func(*options)

type options struct {
	peerProxies bool
}

// WithPeerProxies puts a Proxy in front of every member's peer listener: a member listens on
// its own peer URL but advertises its proxy's, so that Partition can cut it off from its
// peers. Members' client URLs are not proxied.
func WithPeerProxies() Option { return func(o *options) { o.peerProxies = true } }
