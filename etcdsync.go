package etcdsync

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/metric"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Option configures a primitive of any etcdsync package; New returns [ErrInvalidOption],
// wrapped with the detail, for an invalid one, and for one that means nothing for its
// primitive (an election's WithPreference given to a mutex, WithMaxHold to a barrier,
// WithTTL to a latch), naming it.
type Option = core.Option

// DefaultTTL is the lease TTL without [WithTTL], 60 s: a holder that dies frees what it
// held after it.
const DefaultTTL = core.DefaultTTL

// WithTTL sets the TTL of the lease that the primitive's keys are bound to (see Leases in
// the package doc), from 1 s to etcd's limit of 9,000,000,000 s; a fraction of a second is
// rounded up. It cannot be combined with [WithSession].
func WithTTL(ttl time.Duration) Option { return core.WithTTL(ttl) }

// WithSession makes the primitive bind its keys to s, the caller's session, as it is: its
// lease, its keep-alive and its lifetime. It is never closed or replaced, and has no local
// deadline; once it has ended, acquisitions return [ErrLost]. It cannot be combined with
// [WithTTL].
func WithSession(s *concurrency.Session) Option { return core.WithSession(s) }

// WithPrefix puts the primitive's keys under prefix, which must end with '/' and, like a
// name, be valid UTF-8 without NUL of at most 512 bytes: the keys of name then live under
// prefix + name + "/", with any '/' in name escaped as %2F and '%' as %25. An etcd role
// granting READWRITE on prefix, or a namespace of it, covers every name; names stay
// independent of each other ("a" and "a/b" never share a key).
func WithPrefix(prefix string) Option { return core.WithPrefix(prefix) }

// WithMeterProvider makes the primitive record its metrics (see docs/metrics.md) through
// mp instead of the global MeterProvider, which is the default (one set with
// otel.SetMeterProvider after New is used as well). mp must not be nil.
func WithMeterProvider(mp metric.MeterProvider) Option { return core.WithMeterProvider(mp) }

// WithNameAttribute adds the primitive's name to its measurements and spans as the
// attribute etcdsync.name. Without it they carry none, so that the number of series stays
// bounded however many names are used.
func WithNameAttribute() Option { return core.WithNameAttribute() }

// WithEtcdLayout puts a name's keys exactly where etcd's concurrency.NewMutex(s, name),
// concurrency.NewElection and recipe.NewRWMutex put them for the same string: under name
// and a '/', not escaped. A service moving from etcd's primitives to these, one process at
// a time, uses it so that both exclude each other on a name with '/' ("/my-lock/",
// "jobs/nightly"). Its names then nest as etcd's do: a key of "a/b" lies under "a/", so
// "a" counts it. Without it (the default) every name is escaped and independent; names
// without '/' and '%' lie where etcd's do either way. Every handle of a name must agree.
func WithEtcdLayout() Option { return core.WithEtcdLayout() }

// WithMaxHold bounds every hold of the primitive to d from its grant, however long its
// lease lives: then the hold ends by itself as a loss whose error matches [ErrMaxHold]
// (Done closes, and the ctx of a Do or of a leader's term ends with it as its cause), and
// then its key is deleted, fenced on its token, so that the next waiter is served. A
// reentrant lock counts from its outermost Lock, the readers of one RWMutex handle (who
// share a key) from the first, an election from each Campaign (a term of Run). d must be
// above 0.
//
// Cost: a timer per hold; the delete is one Txn.
func WithMaxHold(d time.Duration) Option { return core.WithMaxHold(d) }

// WithYieldOnAsk makes every Do of the primitive heed an ask that its hold let go (see
// Asking a holder to let go in the package doc): fn's ctx then ends with an [AskedError] as its cause,
// and Do releases once fn has returned, joining fn's error, if any, with the AskedError. A
// lock's option (mutex, Multi, rwmutex, reentrant, semaphore, once); an election heeds its
// asks without it.
//
// Cost: the watch of the ask's record, from the grant until the hold ends.
func WithYieldOnAsk() Option { return core.WithYieldOnAsk() }

// WithLockDelay makes a waiter of the primitive that is served by the end of a key that
// went with its lease (its holder crashed or was cut off, and its lease expired, or the
// lease was revoked) wait d more from then, from 0 (the default) to 60 s: the holder that
// did not let go may still have work in flight somewhere that cannot check a token. After
// a release it is served at once. A waiter whose view of the line was rebuilt by a read
// (after a reconnect or a compaction, or one far back in line) cannot tell how its
// predecessor went, and waits d as well. A name free when asked for is taken at once.
//
// Cost: one LeaseTimeToLive when a waiter is served by a delete.
func WithLockDelay(d time.Duration) Option { return core.WithLockDelay(d) }

// Shutdown revokes the leases that the primitives of every package share on cli (one per
// TTL in use), for a process about to exit: every hold and waiting acquisition on them ends
// at once (Done closes, Err returns [ErrLost]) and their keys go, so that other processes
// need not wait a TTL; without it, a closed client's keys go when its lease expires. An
// acquisition after Shutdown grants a new lease. Sessions given with [WithSession] are the
// caller's to close. A lease that carries no key (every hold released, nobody waiting) is
// not revoked, only no longer renewed, and expires after its TTL: so a process that
// releases and then shuts down is seen by a waiter with [WithLockDelay] to have released.
//
// Errors: [ErrInvalidOption] for a nil cli; otherwise the revocations that failed before
// ctx ended (each is retried through leader changes of etcd until then).
//
// Cost: one LeaseRevoke per shared lease that carries a key.
func Shutdown(ctx context.Context, cli *clientv3.Client) error {
	if cli == nil {
		return fmt.Errorf("etcdsync: shutdown: %w: nil client", ErrInvalidOption)
	}
	return core.Shutdown(ctx, cli)
}
