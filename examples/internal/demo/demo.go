// Package demo is what every example needs to reach etcd: the -endpoints flag, an etcd
// embedded in the process when no endpoints are given, and clients that are closed
// together at the end.
package demo

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcdsync/etcdsync/internal/etcdtest"
)

// EndpointsFlag defines -endpoints, whose default is $ETCD_ENDPOINTS.
func EndpointsFlag() *string {
	return flag.String("endpoints", os.Getenv("ETCD_ENDPOINTS"),
		"etcd endpoints, comma-separated (default: $ETCD_ENDPOINTS, else an embedded etcd)")
}

// Etcd is the etcd an example runs against, and the clients it opened on it.
type Etcd struct {
	cfg      clientv3.Config
	embedded *etcdtest.Cluster // nil when endpoints were given

	mu      sync.Mutex
	clients []*clientv3.Client
}

// Start reaches the etcd at endpoints (comma-separated), or, when there are none, starts
// one in this process and says where. Close ends what Start and Client opened.
func Start(endpoints string) (*Etcd, error) {
	if endpoints != "" {
		return &Etcd{cfg: clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}}, nil
	}
	c, err := etcdtest.NewEmbedded(1)
	if err != nil {
		return nil, err
	}
	fmt.Println("embedded etcd at", strings.Join(c.Endpoints(), ","))
	return &Etcd{cfg: c.ClientConfig(), embedded: c}, nil
}

// Client opens a client of its own, closed by Close.
func (e *Etcd) Client() (*clientv3.Client, error) {
	cli, err := clientv3.New(e.cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	e.mu.Lock()
	e.clients = append(e.clients, cli)
	e.mu.Unlock()
	return cli, nil
}

// Close closes every client Client opened, then the embedded etcd if there is one.
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
}
