package election

import (
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/metric"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Option configures an Election. Options of every etcdsync package are interchangeable.
type Option = core.Option

// DefaultTTL is the lease TTL without WithTTL, 60 s (as etcd's concurrency.Session): a
// leader that dies hands over after it.
const DefaultTTL = core.DefaultTTL

// WithTTL sets the TTL of the lease the candidates' keys are bound to, from one second
// (rounded up to whole seconds) to etcd's limit of 9,000,000,000 s; New refuses others with
// ErrInvalidOption. Primitives on one client with one TTL share a lease.
// When no renewal of the shared lease gets through for the TTL less a margin (1% of it
// plus 100 ms), its holds end locally with ErrLost, before etcd can let it expire.
func WithTTL(ttl time.Duration) Option { return core.WithTTL(ttl) }

// WithSession makes the Election use s, the caller's session, as it is: its lease and its
// lifetime. It is never closed or replaced; once it has expired, Campaign returns ErrLost.
// It cannot be combined with WithTTL.
// Its end is known when its own keep-alive or the hold's watch notices, with no local
// deadline (see WithTTL): a holder cut off from etcd may learn of its loss late.
func WithSession(s *concurrency.Session) Option { return core.WithSession(s) }

// WithPrefix puts the Election's keys under prefix, which must end with '/': the keys of
// name then live under prefix + name + "/", with any '/' in name escaped as %2F and '%'
// as %25. An etcd role granting READWRITE on prefix, or a namespace of it, covers every
// name; names stay independent of each other ("a" and "a/b" never share a key).
func WithPrefix(prefix string) Option { return core.WithPrefix(prefix) }

// WithMeterProvider makes the Election record its metrics (see docs/metrics.md)
// through mp instead of the global MeterProvider, which is the default: one set with
// otel.SetMeterProvider after New is used as well. A nil mp makes New return
// ErrInvalidOption.
func WithMeterProvider(mp metric.MeterProvider) Option { return core.WithMeterProvider(mp) }

// WithNameAttribute adds the Election's name to its measurements and spans as the attribute
// etcdsync.name. Without it they carry none, so that the number of series stays bounded
// however many names are used.
func WithNameAttribute() Option { return core.WithNameAttribute() }

// The errors of this package, shared with every etcdsync package; compare with errors.Is.
var (
	ErrInvalidName   = core.ErrInvalidName   // New: empty, over 512 bytes, NUL, not UTF-8
	ErrInvalidOption = core.ErrInvalidOption // New: a bad option or a nil client; any call: a handle not made by New, a closed client
	ErrNotLeader     = core.ErrNotLeader     // Proclaim, Resign, Err: this handle does not lead
	ErrNotLocked     = core.ErrNotLocked     // Err without leadership (also matches ErrNotLeader)
	ErrNoLeader      = core.ErrNoLeader      // Leader: nobody leads
	ErrLost          = core.ErrLost          // the leadership ended without Resign
)
