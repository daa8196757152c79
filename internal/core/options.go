package core

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/metric"
)

// DefaultTTL is the lease TTL without WithTTL: the same as etcd's concurrency.Session.
const DefaultTTL = 60 * time.Second

// MaxTTL is the longest lease TTL etcd grants (its lease.MaxLeaseTTL, 9,000,000,000 s, about
// 285 years): a longer one would be refused by every grant, or, past what time.Duration
// holds once rounded up, wrap around to etcd's minimum.
const MaxTTL = 9_000_000_000 * time.Second

// Option configures a primitive. Every package's WithTTL and WithSession return one, so
// options are interchangeable between packages.
type Option func(*Config)

// Config is what the options set; Options builds it.
type Config struct {
	TTL     time.Duration        // lease TTL of the shared session, whole seconds
	Session *concurrency.Session // the caller's session, or nil for the shared one
	Prefix  string               // WithPrefix's key prefix, "" for the root of the keyspace
	Meter   metric.MeterProvider // WithMeterProvider's, or nil for the global one
	// NameAttribute: measurements and spans carry the name (WithNameAttribute).
	NameAttribute bool
	MaxHold       time.Duration // WithMaxHold's: a hold ends by itself after it; 0: never
	LockDelay     time.Duration // WithLockDelay's
	YieldOnAsk    bool          // WithYieldOnAsk: a Do's fn's ctx ends when its hold is asked to let go
	Preference    int           // an election candidate's WithPreference; 0 for none
	Settle        time.Duration // an election's WithSettle: DefaultSettle without it
	// EtcdLayout: a name's keys are under the name as it is, not escaped (WithEtcdLayout).
	EtcdLayout  bool
	noTelemetry bool // WithoutTelemetry
	errs        []error
	ttlSet      bool
	used        optionSet // the options given, for OptionsFor
}

// optionSet is a set of options, one bit each.
type optionSet uint16

const (
	optTTL optionSet = 1 << iota
	optSession
	optPrefix
	optMeter
	optNameAttribute
	optNoTelemetry
	optMaxHold
	optLockDelay
	optPreference
	optSettle
	optEtcdLayout
	optYieldOnAsk
)

// optionNames name the options, in the order of their bits.
var optionNames = []string{"WithTTL", "WithSession", "WithPrefix", "WithMeterProvider", "WithNameAttribute",
	"WithoutTelemetry", "WithMaxHold", "WithLockDelay", "WithPreference", "WithSettle", "WithEtcdLayout", "WithYieldOnAsk"}

// The options each kind of primitive takes: a latch holds nothing and has no lease; a
// barrier's participants are on a lease, but hold nothing for long; a lock (mutex,
// reentrant, rwmutex, semaphore, Multi) holds, and may be asked to let go; an election's
// candidates also have a preference and a settle time, and an election heeds its own asks.
const (
	ForLatch    = optPrefix | optMeter | optNameAttribute | optNoTelemetry | optEtcdLayout
	ForBarrier  = ForLatch | optTTL | optSession
	ForLock     = ForBarrier | optMaxHold | optLockDelay | optYieldOnAsk
	ForElection = ForLock&^optYieldOnAsk | optPreference | optSettle
)

// option is an Option that records that it was given.
func option(bit optionSet, apply func(*Config)) Option {
	return func(c *Config) {
		c.used |= bit
		apply(c)
	}
}

// WithTTL sets the lease TTL, from one second to MaxTTL; a fraction of a second is rounded
// up, since etcd leases count whole seconds.
func WithTTL(ttl time.Duration) Option {
	return option(optTTL, func(c *Config) {
		switch {
		case ttl < time.Second:
			c.errs = append(c.errs, fmt.Errorf("%w: TTL %v is under 1s", ErrInvalidOption, ttl))
			return
		case ttl > MaxTTL:
			c.errs = append(c.errs, fmt.Errorf("%w: TTL %v is over etcd's limit of %v", ErrInvalidOption, ttl, MaxTTL))
			return
		}
		c.TTL = ((ttl + time.Second - 1) / time.Second) * time.Second
		c.ttlSet = true
	})
}

// WithSession makes the primitive use s as it is: its lease, its keep-alive, its lifetime.
func WithSession(s *concurrency.Session) Option {
	return option(optSession, func(c *Config) {
		if s == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: nil session", ErrInvalidOption))
			return
		}
		c.Session = s
	})
}

// WithPrefix puts every key of the primitive under prefix: a name's keys then live under
// prefix + the escaped name + "/", so that an etcd role granting a key prefix, or a
// namespace, covers every name. prefix must end with '/' and, like a name, be valid UTF-8
// without NUL of at most MaxNameLen bytes.
func WithPrefix(prefix string) Option {
	return option(optPrefix, func(c *Config) {
		if err := validPrefix(prefix); err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.Prefix = prefix
	})
}

// WithMaxHold makes every hold end by itself d after it was granted (see life.go).
func WithMaxHold(d time.Duration) Option {
	return option(optMaxHold, func(c *Config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: maximum hold %v is not above 0", ErrInvalidOption, d))
			return
		}
		c.MaxHold = d
	})
}

// WithYieldOnAsk makes a Do's fn's ctx end when its hold is asked to let go (Scoped).
func WithYieldOnAsk() Option {
	return option(optYieldOnAsk, func(c *Config) { c.YieldOnAsk = true })
}

// MaxLockDelay is the longest lock-delay WithLockDelay takes.
const MaxLockDelay = time.Minute

// WithLockDelay makes a waiter whose predecessor's key went with its lease wait d more
// before it is served (see life.go); 0 to MaxLockDelay.
func WithLockDelay(d time.Duration) Option {
	return option(optLockDelay, func(c *Config) {
		if d < 0 || d > MaxLockDelay {
			c.errs = append(c.errs, fmt.Errorf("%w: lock-delay %v is not within 0 to %v", ErrInvalidOption, d, MaxLockDelay))
			return
		}
		c.LockDelay = d
	})
}

// MaxPreference is the highest preference WithPreference takes.
const MaxPreference = 1_000_000

// WithPreference makes an election's candidate preferred as leader over those of a lower
// preference (0 without it), from 0 to MaxPreference.
func WithPreference(n int) Option {
	return option(optPreference, func(c *Config) {
		if n < 0 || n > MaxPreference {
			c.errs = append(c.errs, fmt.Errorf("%w: preference %d is not within 0 to %d", ErrInvalidOption, n, MaxPreference))
			return
		}
		c.Preference = n
	})
}

// DefaultSettle is an election's settle time without WithSettle.
const DefaultSettle = 10 * time.Second

// WithSettle sets an election's settle time, from 100 ms to an hour.
func WithSettle(d time.Duration) Option {
	return option(optSettle, func(c *Config) {
		if d < 100*time.Millisecond || d > time.Hour {
			c.errs = append(c.errs, fmt.Errorf("%w: settle time %v is not within 100ms to 1h", ErrInvalidOption, d))
			return
		}
		c.Settle = d
	})
}

// WithEtcdLayout puts a name's keys where etcd's concurrency and recipes put them for the
// same string: under the name as it is and a '/', not escaped (see KeyPrefix).
func WithEtcdLayout() Option {
	return option(optEtcdLayout, func(c *Config) { c.EtcdLayout = true })
}

// KeyPrefix is the key prefix that holds every key of name under c's prefix: the escaped
// name and a '/' (NamePrefix); with EtcdLayout, the name as it is and a '/', as etcd's
// concurrency.NewMutex(s, name) takes name + "/".
func (c Config) KeyPrefix(name string) string {
	if c.EtcdLayout {
		return c.Prefix + name + "/"
	}
	return c.Prefix + NamePrefix(name)
}

// NameOfKindKey splits key, one of a kind's keys ("<name>/<kind><rest>" as KeyPrefix lays
// them out, kind such as KindPermit), into the name (unescaped, but with EtcdLayout) and
// the rest; false when key is not under c's prefix or is not one of kind's. Escaped names
// hold no '/'; with EtcdLayout the name ends at the last "/<kind>", since the rest of a
// key (a lease and a slot, or units and those) holds none.
func (c Config) NameOfKindKey(key, kind string) (name, rest string, ok bool) {
	r, ok := strings.CutPrefix(key, c.Prefix)
	i := strings.LastIndex(r, "/"+kind)
	if !ok || i <= 0 || i+1+len(kind) == len(r) {
		return "", "", false
	}
	name, rest = r[:i], r[i+1+len(kind):]
	if c.EtcdLayout {
		return name, rest, true
	}
	if strings.Contains(name, "/") {
		return "", "", false
	}
	return UnescapeName(name), rest, true
}

// Options applies opts to the defaults and reports every invalid one, wrapped around
// ErrInvalidOption.
func Options(opts []Option) (Config, error) {
	c := Config{TTL: DefaultTTL, Settle: DefaultSettle}
	for _, opt := range opts {
		if opt == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: nil option", ErrInvalidOption))
			continue
		}
		opt(&c)
	}
	if c.ttlSet && c.Session != nil {
		c.errs = append(c.errs, fmt.Errorf("%w: WithTTL and WithSession together (the session has its own TTL)", ErrInvalidOption))
	}
	return c, errors.Join(c.errs...)
}

// OptionsFor is Options for a primitive that takes the options in takes (ForLock, ...):
// any other given is ErrInvalidOption, naming it and what (a barrier, ...), since it would
// mean nothing there and be silently ignored.
func OptionsFor(what string, takes optionSet, opts []Option) (Config, error) {
	c, err := Options(opts)
	errs := []error{err}
	for i, name := range optionNames {
		if bit := optionSet(1) << i; c.used&bit != 0 && takes&bit == 0 {
			errs = append(errs, fmt.Errorf("%w: %s has no meaning for %s", ErrInvalidOption, name, what))
		}
	}
	return c, errors.Join(errs...)
}

// Sessions hands out the session whose lease an acquisition writes its key under.
type Sessions interface {
	// Session returns a live session; it may grant a lease (one RPC) when there is none.
	Session(ctx context.Context) (*Session, error)
	// Expired tells the source that s was found dead (etcd said its lease is not found), so
	// that the next Session call does not return it again. It returns ErrMixedClusters when
	// no new lease can help: the client's endpoints are of different clusters.
	Expired(ctx context.Context, s *Session) error
	// Retire takes s out of use for new acquisitions (see Session.retire).
	Retire(s *Session)
}

// SessionsFor returns the session source of a primitive on cli configured by c: the
// caller's own session, or the one shared by every primitive on cli with the same TTL.
func SessionsFor(cli *clientv3.Client, c Config) Sessions {
	if c.Session != nil {
		return newFixedSession(c.Session)
	}
	s := shared(cli, int64(c.TTL/time.Second))
	s.meter(c.Meter)
	return s
}

// fixedSession is a caller's session, used untouched: never replaced, retired or closed,
// and its end known only when its own keep-alive reports it.
type fixedSession struct {
	cs *concurrency.Session
	s  *Session
}

func newFixedSession(cs *concurrency.Session) fixedSession {
	// Its Ctx ends when its keep-alive does (the lease expired or was revoked) or it is closed.
	ctx, end := context.WithCancelCause(cs.Ctx())
	return fixedSession{cs, &Session{id: cs.Lease(), ctx: ctx, end: end}}
}

func (f fixedSession) Session(context.Context) (*Session, error) {
	if f.s.ended() {
		return nil, fmt.Errorf("%w: %w", ErrLost, errCallerEnded)
	}
	return f.s, nil
}

func (fixedSession) Expired(context.Context, *Session) error { return nil }

func (fixedSession) Retire(*Session) {}
