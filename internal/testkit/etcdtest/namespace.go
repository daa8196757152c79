package etcdtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	nswatch "github.com/etcdsync/etcdsync/internal/namespace"
)

// RunPrefix is where the namespaces of test runs on external clusters live: each run of a
// test binary takes RunPrefix + "<binary>-<random>/" (see Cluster.Prefix).
const RunPrefix = "etcdsync-test/"

// runPrefix returns a namespace of this run's own: RunPrefix, this test binary's name
// ("mutex.test") and 48 random bits.
func runPrefix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("etcdtest: random run prefix: %v", err))
	}
	bin := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	return RunPrefix + bin + "-" + hex.EncodeToString(b[:]) + "/"
}

// Prefix returns the namespace of every client the cluster opens (Client, NewClient, Open,
// PinnedClient, SpreadClient, ProxiedClient): "" on an embedded cluster, which is the test's
// alone; on an external cluster, a prefix of this run's own under RunPrefix, so that runs,
// test binaries running at once and other data on the cluster never meet. Close deletes
// everything under it.
func (c *Cluster) Prefix() string { return c.prefix }

// Confine makes cli read, write and watch inside prefix, as etcd's namespace package does
// for a multi-tenant client; leases are not keyed, so they are shared. Every client a
// Cluster opens on an external cluster is confined to its Prefix; the examples confine
// theirs the same way.
func Confine(cli *clientv3.Client, prefix string) {
	cli.KV = namespace.NewKV(cli.KV, prefix)
	cli.Watcher = nswatch.NewWatcher(cli.Watcher, prefix)
	cli.Lease = namespace.NewLease(cli.Lease, prefix)
}

// deleteTimeout bounds DeletePrefix.
const deleteTimeout = 30 * time.Second

// DeletePrefix deletes every key under prefix with a client of its own on cfg, within 30 s,
// and returns how many there were.
func DeletePrefix(cfg clientv3.Config, prefix string) (int64, error) {
	cli, err := clientv3.New(cfg)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	resp, err := cli.Delete(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	return resp.Deleted, nil
}

// sweep deletes every key under Prefix, saying on stderr how many there were: the keys a
// test left (a semaphore's limit record, a value a test wrote, a key of a lease that has not
// yet expired).
func (c *Cluster) sweep() {
	n, err := DeletePrefix(c.ClientConfig(), c.prefix)
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "etcdtest: cannot delete %s: %v\n", c.prefix, err)
	case n > 0:
		fmt.Fprintf(os.Stderr, "etcdtest: deleted the %d keys the tests left under %s\n", n, c.prefix)
	}
}
