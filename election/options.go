package election

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/metric"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/internal/core"
)

// What every etcdsync package shares is defined and documented in package etcdsync; these
// are its names, so that code using this package needs no second import.

// Option is [etcdsync.Option].
type Option = etcdsync.Option

// DefaultTTL is [etcdsync.DefaultTTL].
const DefaultTTL = etcdsync.DefaultTTL

// WithTTL is [etcdsync.WithTTL].
func WithTTL(ttl time.Duration) Option { return etcdsync.WithTTL(ttl) }

// WithSession is [etcdsync.WithSession].
func WithSession(s *concurrency.Session) Option { return etcdsync.WithSession(s) }

// WithPrefix is [etcdsync.WithPrefix].
func WithPrefix(prefix string) Option { return etcdsync.WithPrefix(prefix) }

// WithEtcdLayout is [etcdsync.WithEtcdLayout].
func WithEtcdLayout() Option { return etcdsync.WithEtcdLayout() }

// WithMaxHold is [etcdsync.WithMaxHold].
func WithMaxHold(d time.Duration) Option { return etcdsync.WithMaxHold(d) }

// WithLockDelay is [etcdsync.WithLockDelay].
func WithLockDelay(d time.Duration) Option { return etcdsync.WithLockDelay(d) }

// WithPreference makes this handle's candidates preferred as leader over those of a lower
// preference, from 0 (the default) to 1,000,000: a [Election.Run] whose candidate of a
// lower preference leads hands the leadership over, by [Election.Transfer], to the most
// preferred candidate once that one has waited a settle time ([WithSettle]) and the leader
// has led that long. A leader never hands over to a candidate of its own preference or a
// lower one, so leadership settles on the most preferred candidate and stays there.
//
// A candidate with a preference above 0 writes its key as "<name>/p<n>/<lease hex>_<slot>"
// (see docs/key-layout.md): etcd's own Election and `etcdctl elect` still see it as a
// candidate in the order of its arrival.
func WithPreference(n int) Option { return core.WithPreference(n) }

// WithSettle is the settle time of [WithPreference]: how long a more preferred candidate
// waits, and a leader leads, before a leader hands over for preference; from 100 ms to an
// hour, 10 s without it.
func WithSettle(d time.Duration) Option { return core.WithSettle(d) }

// WithMeterProvider is [etcdsync.WithMeterProvider].
func WithMeterProvider(mp metric.MeterProvider) Option { return etcdsync.WithMeterProvider(mp) }

// WithNameAttribute is [etcdsync.WithNameAttribute].
func WithNameAttribute() Option { return etcdsync.WithNameAttribute() }

// Shutdown is [etcdsync.Shutdown].
func Shutdown(ctx context.Context, cli *clientv3.Client) error { return etcdsync.Shutdown(ctx, cli) }

// The errors this package returns, those of package etcdsync; compare with errors.Is.
var (
	ErrInvalidName   = etcdsync.ErrInvalidName
	ErrInvalidOption = etcdsync.ErrInvalidOption
	ErrNotLeader     = etcdsync.ErrNotLeader
	ErrNotLocked     = etcdsync.ErrNotLocked
	ErrNoLeader      = etcdsync.ErrNoLeader
	ErrNoCandidate   = etcdsync.ErrNoCandidate
	ErrLost          = etcdsync.ErrLost
)
