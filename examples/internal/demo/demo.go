// Package demo is what every example needs to reach etcd: the -endpoints, -prefix and -keep
// flags, an etcd embedded in the process when no endpoints are given, and clients that are
// closed together at the end.
package demo

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// ExamplePrefix is where examples write on a real cluster unless -prefix says otherwise:
// each run under ExamplePrefix + "<example>-<random>/".
const ExamplePrefix = "etcdsync-example/"

var (
	prefix = flag.String("prefix", "", "on a real cluster, write every key under this `prefix` (default: "+ExamplePrefix+"<example>-<random>/)")
	keep   = flag.Bool("keep", false, "on a real cluster, keep the keys the example wrote (default: delete everything under -prefix at the end)")
)

// EndpointsFlag defines -endpoints, whose default is $ETCD_ENDPOINTS. (-prefix and -keep,
// for a real cluster, come with the package.)
func EndpointsFlag() *string {
	return flag.String("endpoints", os.Getenv("ETCD_ENDPOINTS"),
		"etcd endpoints, comma-separated (default: $ETCD_ENDPOINTS, else an embedded etcd)")
}

// Etcd is the etcd an example runs against, and the clients it opened on it.
type Etcd struct {
	cfg      clientv3.Config
	embedded *etcdtest.Cluster // nil when endpoints were given
	prefix   string            // every client's namespace on a real cluster; "" on the embedded one

	mu      sync.Mutex
	clients []*clientv3.Client
}

// Start reaches the etcd at endpoints (comma-separated), or, when there are none, starts
// one in this process and says where. On a real cluster every client it opens works inside
// -prefix (a namespace), which Close deletes unless -keep. Close ends what Start and Client
// opened.
func Start(endpoints string) (*Etcd, error) {
	if endpoints == "" {
		c, err := etcdtest.NewEmbedded(1)
		if err != nil {
			return nil, err
		}
		fmt.Println("embedded etcd at", strings.Join(c.Endpoints(), ","))
		return &Etcd{cfg: c.ClientConfig(), embedded: c}, nil
	}
	p := *prefix
	if p == "" {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		p = ExamplePrefix + filepath.Base(os.Args[0]) + "-" + hex.EncodeToString(b[:]) + "/"
	}
	if *keep {
		fmt.Printf("writing under %s (kept at the end)\n", p)
	} else {
		fmt.Printf("writing under %s (deleted at the end; -keep keeps it)\n", p)
	}
	cfg := clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	return &Etcd{cfg: cfg, prefix: p}, nil
}

// Client opens a client of its own, closed by Close.
func (e *Etcd) Client() (*clientv3.Client, error) {
	cli, err := clientv3.New(e.cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if e.prefix != "" {
		etcdtest.Confine(cli, e.prefix)
	}
	e.mu.Lock()
	e.clients = append(e.clients, cli)
	e.mu.Unlock()
	return cli, nil
}

// Join returns what a process that the example starts needs to reach the same etcd, inside
// the same prefix ("" on the embedded one): pass both to Connect in that process.
func (e *Etcd) Join() (endpoints, prefix string) {
	return strings.Join(e.cfg.Endpoints, ","), e.prefix
}

// Connect opens a client of endpoints (comma-separated) confined to prefix unless it is "",
// in a process that an example started (see Join). It embeds nothing and deletes nothing:
// the example's own Close does. The caller closes the client.
func Connect(endpoints, prefix string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if prefix != "" {
		etcdtest.Confine(cli, prefix)
	}
	return cli, nil
}

// Close closes every client Client opened, then the embedded etcd if there is one; on a
// real cluster it deletes everything under the prefix, unless -keep.
func (e *Etcd) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, cli := range e.clients {
		cli.Close()
	}
	e.clients = nil
	if e.embedded != nil {
		e.embedded.Close()
	}
	if e.prefix != "" && !*keep {
		e.sweep()
	}
}

// sweep deletes every key under the prefix, with a client of its own.
func (e *Etcd) sweep() {
	if _, err := etcdtest.DeletePrefix(e.cfg, e.prefix); err != nil {
		fmt.Fprintf(os.Stderr, "cannot delete %s: %v\n", e.prefix, err)
	}
}
