package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RootUser is the CommonName of the certificate that ClientConfig presents on a WithTLS
// cluster, and the user etcd takes it for once auth is on (see EnableAuth).
const RootUser = "root"

// certValidity is how long the certificates of a test cluster are valid; they start an hour
// in the past, so that a clock that differs a little does not matter.
const certValidity = 24 * time.Hour

// authority is the certificate authority of a WithTLS cluster. Its key and the client keys
// stay in memory; what etcd reads from files (the CA certificate, the serving certificate and
// its key) is written under dir, which Cluster.Close removes.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	dir  string

	mu      sync.Mutex
	clients map[string]tls.Certificate // by CommonName: issued once each
}

// newAuthority makes a CA and writes its certificate under dir.
func newAuthority(dir string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: CA key: %w", err)
	}
	tmpl, err := certTemplate("etcdtest CA")
	if err != nil {
		return nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: CA certificate: %w", err)
	}
	a := &authority{cert: cert, key: key, pool: x509.NewCertPool(), dir: dir, clients: map[string]tls.Certificate{}}
	a.pool.AddCert(cert)
	if err := writePEM(a.caFile(), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *authority) caFile() string { return filepath.Join(a.dir, "ca.pem") }

// serverTLS issues the members' serving certificate, for 127.0.0.1 and localhost, writes it
// and its key under dir, and returns etcd's TLS settings for client connections: that
// certificate, and a client certificate signed by this CA required of every client.
func (a *authority) serverTLS() (transport.TLSInfo, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return transport.TLSInfo{}, fmt.Errorf("etcdtest: server key: %w", err)
	}
	tmpl, err := certTemplate("etcdtest server")
	if err != nil {
		return transport.TLSInfo{}, err
	}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	// ClientAuth too: etcd presents its serving certificate when it dials itself.
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return transport.TLSInfo{}, fmt.Errorf("etcdtest: server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return transport.TLSInfo{}, fmt.Errorf("etcdtest: server key: %w", err)
	}
	info := transport.TLSInfo{
		CertFile:       filepath.Join(a.dir, "server.pem"),
		KeyFile:        filepath.Join(a.dir, "server-key.pem"),
		TrustedCAFile:  a.caFile(),
		ClientCertAuth: true,
	}
	if err := writePEM(info.CertFile, "CERTIFICATE", der); err != nil {
		return transport.TLSInfo{}, err
	}
	if err := writePEM(info.KeyFile, "EC PRIVATE KEY", keyDER); err != nil {
		return transport.TLSInfo{}, err
	}
	return info, nil
}

// clientCert returns the client certificate of commonName, issuing it on first use.
func (a *authority) clientCert(commonName string) (tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cert, ok := a.clients[commonName]; ok {
		return cert, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("etcdtest: client key: %w", err)
	}
	tmpl, err := certTemplate(commonName)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("etcdtest: client certificate %q: %w", commonName, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("etcdtest: client certificate %q: %w", commonName, err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	a.clients[commonName] = cert
	return cert, nil
}

// tlsConfig is a client configuration that presents the certificate of commonName and
// trusts this CA alone.
func (a *authority) tlsConfig(commonName string) (*tls.Config, error) {
	cert, err := a.clientCert(commonName)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: a.pool, MinVersion: tls.VersionTLS12}, nil
}

// certTemplate is a certificate for commonName with a random serial number, valid from an
// hour ago for certValidity.
func certTemplate(commonName string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("etcdtest: serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
	}, nil
}

func writePEM(path, blockType string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("etcdtest: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

var errNoTLS = errors.New("etcdtest: the cluster was not started WithTLS")

// TLSConfig returns a client TLS configuration for a WithTLS cluster: a certificate whose
// CommonName is commonName, signed by the cluster's CA, and that CA as the only one trusted.
// Once auth is on (EnableAuth), etcd takes a client presenting it for user commonName. A
// cluster started without WithTLS returns an error.
func (c *Cluster) TLSConfig(commonName string) (*tls.Config, error) {
	if c.ca == nil {
		return nil, errNoTLS
	}
	return c.ca.tlsConfig(commonName)
}

// ClientAs opens a client of a WithTLS cluster that presents a certificate whose CommonName
// is commonName (see TLSConfig), and closes it in tb.Cleanup; it fails tb if it cannot.
func (c *Cluster) ClientAs(tb testing.TB, commonName string) *clientv3.Client {
	tb.Helper()
	cfg := c.ClientConfig()
	var err error
	if cfg.TLS, err = c.TLSConfig(commonName); err != nil {
		tb.Fatalf("etcdtest: client as %q: %v", commonName, err)
	}
	cfg.Username, cfg.Password = "", ""
	return clientOfConfig(tb, cfg)
}
