package rwmutex

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/metric"

	"github.com/etcdsync/etcdsync"
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

// WithYieldOnAsk is [etcdsync.WithYieldOnAsk].
func WithYieldOnAsk() Option { return etcdsync.WithYieldOnAsk() }

// WithLockDelay is [etcdsync.WithLockDelay].
func WithLockDelay(d time.Duration) Option { return etcdsync.WithLockDelay(d) }

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
	ErrLocked        = etcdsync.ErrLocked
	ErrNotLocked     = etcdsync.ErrNotLocked
	ErrLost          = etcdsync.ErrLost
)
