// Package admin is what an operator's tools need from Go: who holds each name and who waits
// for it, read at one revision (Status), and again at every change (Watch). The etcdsync
// command's status is built on it; a health endpoint or an admin page can ask the same
// without running the command.
//
// It reads the names of every etcdsync primitive, and those of etcd's own
// concurrency.Mutex, concurrency.Election, recipe.RWMutex and etcdctl lock and elect, by
// the rules the primitives wait on: a lock, write or candidate key holds when it is first,
// a read key when no write key is ahead of it, a permit when its units fit within the
// semaphore's limit beside those of the permits ahead of it; a barrier's participant has
// entered once its round filled (by the barrier's record of rounds), a gate's key holds,
// and a latch shows its count (NameStatus.Count). A key asked to let go (Ask) shows the ask
// while its record is there (Entry.Asked), when the client may read it (a grant of a name's
// keys alone does not cover it).
//
// Cost: Status is one Txn of up to 100 ranges per 100 names (without names, first the keys
// under the prefix, keys only, 1,000 per Range), as many for the asks beside them, and one
// LeaseTimeToLive per distinct lease.
package admin

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Option configures Status, Watch, Release and Delete. Its names are admin's own (Prefix,
// not the primitives' WithPrefix): an admin option is no etcdsync.Option.
type Option func(*config)

type config struct {
	prefix    string        // Prefix's
	etcd      bool          // EtcdLayout's
	exclusive string        // what a key directly under a name is: KindLock or KindCandidate
	timeout   time.Duration // Watch's bound of each read and of the watches' start
	errs      []error
}

// Prefix reads the names whose keys are under prefix (which ends with '/'), as the
// primitives' WithPrefix put them there. Without names, every name under it.
func Prefix(prefix string) Option {
	return func(c *config) {
		if prefix != "" && !strings.HasSuffix(prefix, "/") {
			c.errs = append(c.errs, fmt.Errorf("%w: prefix %q does not end with '/'", core.ErrInvalidOption, prefix))
		}
		c.prefix = prefix
	}
}

// EtcdLayout reads names laid out as etcdsync.WithEtcdLayout lays them out: under the name
// as it is and a '/', where etcd's own primitives put them. A scan without names still
// finds names by the escaped layout.
func EtcdLayout() Option {
	return func(c *config) { c.etcd = true }
}

// keyPrefix is where the keys of name are.
func (c config) keyPrefix(name string) string {
	if c.etcd {
		return c.prefix + name + "/"
	}
	return c.prefix + core.NamePrefix(name)
}

// Elections shows the keys directly under a name as an election's candidates (KindCandidate,
// StateLeads), not as a lock's: the keys of the two cannot be told apart.
func Elections() Option {
	return func(c *config) { c.exclusive = KindCandidate }
}

// Timeout bounds each read of Watch, and the start of its watches (default 5 s).
func Timeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: timeout %v", core.ErrInvalidOption, d))
		}
		c.timeout = d
	}
}

// configure checks names and applies opts.
func configure(names []string, opts []Option) (config, error) {
	c := config{exclusive: KindLock, timeout: 5 * time.Second}
	for _, opt := range opts {
		opt(&c)
	}
	if len(c.errs) > 0 {
		return c, c.errs[0]
	}
	for _, n := range names {
		if err := core.ValidateName(n); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Status reads the holders and waiters of each of names, in the order they are served, at
// one revision, with the TTL each one's lease has left; without names, those of every name
// under the prefix (Prefix; the root of the keyspace without it). A name with no key
// has an empty queue.
//
// Errors: ErrInvalidName or ErrInvalidOption (nothing read), or what etcd answered;
// ctx bounds the whole.
func Status(ctx context.Context, cli *clientv3.Client, names []string, opts ...Option) (*Snapshot, error) {
	c, err := configure(names, opts)
	if err != nil {
		return nil, err
	}
	return c.read(ctx, cli, names)
}
