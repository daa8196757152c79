package etcdtest

// Option configures an embedded cluster (NewEmbedded).
type Option func(*options)

type options struct {
	peerProxies  bool
	tls          bool
	jwt          bool
	authTokenTTL uint
}

// WithPeerProxies puts a Proxy in front of every member's peer listener: a member listens on
// its own peer URL but advertises its proxy's, so that Partition can cut it off from its
// peers. Members' client URLs are not proxied.
func WithPeerProxies() Option { return func(o *options) { o.peerProxies = true } }

// WithTLS makes the members serve their clients over https and require a client certificate
// signed by the cluster's own certificate authority, made up for it and gone with it (see
// TLSConfig). ClientConfig, and so every client helper, then presents a certificate whose
// CommonName is "root". Peers still talk plain http.
func WithTLS() Option { return func(o *options) { o.tls = true } }

// WithJWT makes the members issue JSON Web Tokens (HS256, with a key made up for the cluster
// and gone with it) instead of etcd's default simple tokens once EnableAuth has turned auth
// on. A JWT carries the revision of the auth store it was issued at: after any change to
// that store, etcd refuses the old token's requests, and the watch creates of a stream
// opened with it, as old.
func WithJWT() Option { return func(o *options) { o.jwt = true } }

// WithAuthTokenTTL makes the members' simple auth tokens (etcd's default token kind) expire
// after seconds without use, instead of etcd's 300 s; it matters once EnableAuth has run.
func WithAuthTokenTTL(seconds uint) Option { return func(o *options) { o.authTokenTTL = seconds } }
