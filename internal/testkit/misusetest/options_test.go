package misusetest_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// etcdMaxTTL is etcd's lease.MaxLeaseTTL: a grant of a longer TTL is refused.
const etcdMaxTTL = 9_000_000_000 * time.Second

// A constructor is one package's New, with that package's WithTTL.
type constructor struct {
	name string
	new  func(cli *clientv3.Client, name string, ttl time.Duration) error
}

var constructors = []constructor{
	{"mutex", func(cli *clientv3.Client, name string, ttl time.Duration) error {
		_, err := mutex.New(cli, name, mutex.WithTTL(ttl))
		return err
	}},
	{"rwmutex", func(cli *clientv3.Client, name string, ttl time.Duration) error {
		_, err := rwmutex.New(cli, name, rwmutex.WithTTL(ttl))
		return err
	}},
	{"reentrant", func(cli *clientv3.Client, name string, ttl time.Duration) error {
		_, err := reentrant.New(cli, name, reentrant.WithTTL(ttl))
		return err
	}},
	{"semaphore", func(cli *clientv3.Client, name string, ttl time.Duration) error {
		_, err := semaphore.New(cli, name, 1, semaphore.WithTTL(ttl))
		return err
	}},
	{"election", func(cli *clientv3.Client, name string, ttl time.Duration) error {
		_, err := election.New(cli, name, election.WithTTL(ttl))
		return err
	}},
	{"barrier", func(cli *clientv3.Client, name string, ttl time.Duration) error {
		_, err := barrier.New(cli, name, 2, barrier.WithTTL(ttl))
		return err
	}},
}

// TestATTLPastEtcdsLimitIsRefusedByNew: New refuses a TTL that etcd would refuse at every
// grant (over 9,000,000,000 s), and one so long that rounding it up to whole seconds would
// overflow (math.MaxInt64), with ErrInvalidOption; it takes the limit itself.
func TestATTLPastEtcdsLimitIsRefusedByNew(t *testing.T) {
	cli := cluster.Client(t)
	for _, c := range constructors {
		t.Run(c.name, func(t *testing.T) {
			for _, ttl := range []time.Duration{etcdMaxTTL + time.Second, math.MaxInt64} {
				assert.ErrorIs(t, c.new(cli, "ttl", ttl), core.ErrInvalidOption, "WithTTL(%v)", ttl)
			}
			assert.NoError(t, c.new(cli, "ttl", etcdMaxTTL), "WithTTL(etcd's limit)")
		})
	}
}

// TestTheLongestTTLIsGranted: a lock with WithTTL of etcd's limit is granted a lease of
// that TTL; Shutdown revokes it.
func TestTheLongestTTLIsGranted(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	m, err := mutex.New(cli, "misuse-longest-ttl", mutex.WithTTL(etcdMaxTTL))
	require.NoError(t, err)
	require.NoError(t, m.Lock(ctx))
	resp, err := cli.Get(ctx, m.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	assert.Equal(t, int64(etcdMaxTTL/time.Second), ttl.GrantedTTL)
	require.NoError(t, m.Unlock(ctx))
	require.NoError(t, mutex.Shutdown(ctx, cli))
}

// TestNewRefusesAnOptionThatMeansNothingThere: every option has one type, so an election's
// WithPreference compiles in mutex.New; New refuses it, naming it, instead of ignoring it.
// And each takes what it should (an election heeds its asks without WithYieldOnAsk).
func TestNewRefusesAnOptionThatMeansNothingThere(t *testing.T) {
	cli := cluster.Client(t)
	news := map[string]func(opts ...core.Option) error{
		"mutex":     func(opts ...core.Option) error { _, err := mutex.New(cli, "opt", opts...); return err },
		"multi":     func(opts ...core.Option) error { _, err := mutex.NewMulti(cli, []string{"opt"}, opts...); return err },
		"rwmutex":   func(opts ...core.Option) error { _, err := rwmutex.New(cli, "opt", opts...); return err },
		"reentrant": func(opts ...core.Option) error { _, err := reentrant.New(cli, "opt", opts...); return err },
		"semaphore": func(opts ...core.Option) error { _, err := semaphore.New(cli, "opt", 1, opts...); return err },
		"election":  func(opts ...core.Option) error { _, err := election.New(cli, "opt", opts...); return err },
		"barrier":   func(opts ...core.Option) error { _, err := barrier.New(cli, "opt", 2, opts...); return err },
		"gate":      func(opts ...core.Option) error { _, err := barrier.NewGate(cli, "opt", opts...); return err },
		"latch":     func(opts ...core.Option) error { _, err := latch.New(cli, "opt", opts...); return err },
	}
	options := map[string]core.Option{
		"WithTTL": etcdsync.WithTTL(time.Minute), "WithPrefix": etcdsync.WithPrefix("app/"),
		"WithMaxHold": etcdsync.WithMaxHold(time.Minute), "WithLockDelay": etcdsync.WithLockDelay(time.Second),
		"WithPreference": election.WithPreference(3), "WithSettle": election.WithSettle(time.Second),
		"WithEtcdLayout": etcdsync.WithEtcdLayout(), "WithNameAttribute": etcdsync.WithNameAttribute(),
		"WithYieldOnAsk": etcdsync.WithYieldOnAsk(),
	}
	takes := map[string][]string{
		"mutex": {"WithTTL", "WithPrefix", "WithMaxHold", "WithLockDelay", "WithEtcdLayout", "WithNameAttribute", "WithYieldOnAsk"},
		"election": {"WithTTL", "WithPrefix", "WithMaxHold", "WithLockDelay", "WithEtcdLayout", "WithNameAttribute",
			"WithPreference", "WithSettle"},
		"barrier": {"WithTTL", "WithPrefix", "WithEtcdLayout", "WithNameAttribute"},
		"gate":    {"WithPrefix", "WithEtcdLayout", "WithNameAttribute"},
		"latch":   {"WithPrefix", "WithEtcdLayout", "WithNameAttribute"},
	}
	for _, same := range []string{"multi", "rwmutex", "reentrant", "semaphore"} {
		takes[same] = takes["mutex"]
	}
	for prim, newP := range news {
		for name, opt := range options {
			err := newP(opt)
			if slices.Contains(takes[prim], name) {
				assert.NoError(t, err, "%s takes %s", prim, name)
				continue
			}
			assert.ErrorIs(t, err, core.ErrInvalidOption, "%s refuses %s", prim, name)
			assert.ErrorContains(t, err, name)
		}
	}
}
