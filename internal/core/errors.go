package core

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The sentinel errors of every etcdsync package. Public packages re-export these values, so
// errors.Is(err, mutex.ErrLocked) and errors.Is(err, rwmutex.ErrLocked) are the same test.
var (
	// ErrInvalidName: a name that is empty, longer than MaxNameLen, not UTF-8 or holds a NUL byte.
	ErrInvalidName = errors.New("etcdsync: invalid name")
	// ErrInvalidOption: an option or argument out of its documented range.
	ErrInvalidOption = errors.New("etcdsync: invalid option")
	// ErrLocked: a try found a holder or a waiter ahead.
	ErrLocked = errors.New("etcdsync: locked")
	// ErrNoPermits: a try found every permit of a semaphore held.
	ErrNoPermits = errors.New("etcdsync: no permits available")
	// ErrNotLocked: a release without a hold.
	ErrNotLocked = errors.New("etcdsync: not locked")
	// ErrLost: the hold (or the wait) ended without a release: its key was deleted or its
	// session's lease expired or was revoked.
	ErrLost = errors.New("etcdsync: lost")
	// ErrLimitMismatch: a semaphore handle's limit differs from the one recorded in etcd.
	ErrLimitMismatch = errors.New("etcdsync: limit mismatch")
	// ErrTimeout: a timed try ran out of time.
	ErrTimeout = errors.New("etcdsync: timeout")
	// ErrNotLeader: an election call that needs leadership made without it.
	ErrNotLeader = errors.New("etcdsync: not leader")
	// ErrNoLeader: an election has no leader now.
	ErrNoLeader = errors.New("etcdsync: no leader")
	// ErrNotEntered: a barrier's Leave without an Enter that returned nil.
	ErrNotEntered = errors.New("etcdsync: not entered")
)

// Busy reports whether err says that a try found the name taken (ErrLocked, ErrNoPermits),
// so that another try may find it free: the one test of it for trylock, the command and the
// tests.
func Busy(err error) bool {
	return errors.Is(err, ErrLocked) || errors.Is(err, ErrNoPermits)
}

// tryTimeout bounds one try of every request the core retries (Retry, CommitWrite): long
// enough to ride out a leader election, short enough that a member that never answers, or
// an answer lost with its connection, is left for another try. A try that times out while
// the caller still has time is tried again.
const tryTimeout = 5 * time.Second

// answerGrace is how long a Txn that may write a key is still awaited once the caller's ctx
// has ended. Its answer says whether a key was written and at which revision, so that the
// cleanup is fenced; past the grace, the outcome stays unknown (see acquisition.abandon).
const answerGrace = time.Second

// cleanupWait bounds the cleanup a cancelled or failed call does before it returns; what is
// not done by then is finished in the background (see janitor).
const cleanupWait = time.Second

// Every request of the core carries clientv3.WithRequireLeader: a member cut off from its
// quorum then refuses it at once (no leader: Unavailable, so retried, and the client's
// balancer sends the retry to another member) instead of holding it until its own timeout.

// transient reports whether err says only that etcd could not answer now (no leader, a
// leader change, a member out of reach or stopping), so the same request may be sent again.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable:
			return true
		case codes.Internal:
			// gRPC's transport, never etcd: a connection garbled on its way (a reset
			// stream, a protocol error), which a new connection gets past.
			return true
		case codes.Unknown:
			return unknownButTransient(s.Message())
		case codes.InvalidArgument:
			// A request whose headers a garbled connection mangled: gRPC refused it
			// before etcd saw it.
			return strings.Contains(s.Message(), "invalid gRPC request content-type")
		}
	}
	return false
}

// transientUnknown are the messages of errors that reach the client with code Unknown but
// say only that a member could not answer now: a member hard-stopped under a request
// ("raft: stopped"), and an HTTP/2 response garbled while a member restarts.
var transientUnknown = []string{
	"raft: stopped",
	"etcdserver: server stopped",
	"malformed header",
	"unexpected HTTP status code received from server",
}

func unknownButTransient(msg string) bool {
	for _, m := range transientUnknown {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// Refused reports whether err is etcd's answer that it did not apply a request (no such
// lease, permission denied, a request it will not take): anything else that is not a
// success leaves it unknown whether a write was applied.
func Refused(err error) bool {
	var ee rpctypes.EtcdError
	if !errors.As(err, &ee) {
		var ok bool
		if ee, ok = rpctypes.Error(err).(rpctypes.EtcdError); !ok {
			return false
		}
	}
	switch ee.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.PermissionDenied,
		codes.Unauthenticated, codes.ResourceExhausted, codes.OutOfRange, codes.AlreadyExists:
		return true
	}
	return false
}

// Retry calls call, each time with a try's context (ctx bounded by tryTimeout), until it
// returns an error that is not transient (nil included) or ctx ends, backing off between
// tries: a try whose bound passed while ctx has time (an answer that never came: a member
// that hangs, a connection that died silently) is tried again, as a transient error is. It
// returns the last call's result, or ctx's error if ctx ended during a pause. Every call
// must be safe to send again after a try whose outcome is unknown.
func Retry[T any](ctx context.Context, call func(ctx context.Context) (T, error)) (T, error) {
	var b Backoff
	for {
		tctx, cancel := context.WithTimeout(ctx, tryTimeout)
		v, err := call(tctx)
		tryEnded := err != nil && tctx.Err() != nil
		cancel()
		if err == nil || ctx.Err() != nil || !(transient(err) || tryEnded) {
			return v, err
		}
		if err := b.wait(ctx); err != nil {
			return v, err
		}
	}
}

// A WriteResult is what became of a Txn that may write an acquisition's key.
type WriteResult struct {
	Resp *clientv3.TxnResponse // etcd's answer; nil if none came
	// Unknown: some try got no answer, so it may have been applied (Resp is then the answer
	// to a later try, or nil).
	Unknown bool
}

// CommitWrite commits the Txn that build makes of a Txn that may write an acquisition's
// key, retried through transient errors and through tries that time out while ctx has time.
// Each try runs on tryContext. It returns etcd's answer if one came, also when ctx ended
// meanwhile (the caller, which may hold a key it no longer wants, removes it); else the
// error, and whether a write may have been applied all the same.
func CommitWrite(ctx context.Context, cli *clientv3.Client, build func(clientv3.Txn) clientv3.Txn) (WriteResult, error) {
	var res WriteResult
	var b Backoff
	for {
		tctx, cancel := tryContext(ctx)
		stop := context.AfterFunc(cli.Ctx(), cancel) // a closed client ends the try
		sent := clockOf(cli).now()
		resp, err := build(cli.Txn(clientv3.WithRequireLeader(tctx))).Commit()
		tryEnded := tctx.Err() != nil
		stop()
		cancel()
		if err == nil {
			res.Resp = resp
			return res, settleLinear(cli, resp.Header, sent)
		}
		if !Refused(err) {
			res.Unknown = true
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if cli.Ctx().Err() != nil {
			return res, fmt.Errorf("%w: %w", ErrLost, errClientClosed) // no try can get through
		}
		if !transient(err) && !tryEnded {
			return res, err
		}
		if err := b.wait(ctx); err != nil {
			return res, err
		}
	}
}

// Backoff is a sequence of delays between retries: the first step is Initial, each next
// one twice the one before, up to Max; each delay is drawn at random from [½, 1½] of its
// step and capped at Max, so that the retries of many clients spread out. The zero value is
// the core's own after a transient error: 25 ms doubling to 1 s. trylock's Retry uses it
// with its own Initial and Max. Not safe for concurrent use.
type Backoff struct {
	Initial, Max time.Duration
	next         time.Duration // the next delay's step; 0 before the first
}

// The zero Backoff's Initial and Max.
const (
	backoffInitial = 25 * time.Millisecond
	backoffMax     = time.Second
)

// Next is the next delay of the sequence.
func (b *Backoff) Next() time.Duration {
	limit := b.Max
	if limit <= 0 {
		limit = backoffMax
	}
	if b.next == 0 {
		b.next = b.Initial
		if b.next <= 0 {
			b.next = backoffInitial
		}
		b.next = min(b.next, limit)
	}
	d := b.next/2 + rand.N(b.next+1)
	b.next = min(2*b.next, limit)
	return min(d, limit)
}

// wait waits for the next delay, or until ctx ends (returning its error).
func (b *Backoff) wait(ctx context.Context) error { return Pause(ctx, b.Next()) }

// Pause waits d, or returns ctx's error if ctx ends first.
func Pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The contexts of this file outlive the context of the call that made them: for work that
// must finish, or be answered, after its caller gave up (a Txn that may have written a key,
// a release in flight, a cleanup).

// Outlive returns a context with ctx's values that ends grace after ctx does (grace from now
// if ctx is done already), or when the returned cancel is called: a deadline that passes
// while a request is in flight leaves it grace to be answered.
func Outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		timer = time.AfterFunc(grace, cancel)
		mu.Unlock()
	})
	return octx, func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// detached returns a context with ctx's values that ignores ctx's end and ends after d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// Detached is a context that outlives ctx's cancellation by at most 5 s, for the public
// packages' own cleanups.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return detached(ctx, tryTimeout)
}

// tryContext is the context of one try of a Txn that may write a key: it outlives ctx, so
// that a try cancelled in flight is still answered (etcd may apply it after the client gave
// up), by answerGrace, and is bounded by tryTimeout in any case.
func tryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	octx, cancel := Outlive(ctx, answerGrace)
	tctx, cancelTry := context.WithTimeout(octx, tryTimeout)
	return tctx, func() { cancelTry(); cancel() }
}

// outlivingKey is the context key of WithOutliving.
type outlivingKey struct{}

// WithOutliving marks ctx, the context of a call made on behalf of parent that is cut short
// before parent ends (a try of trylock.Timeout, whose context ends when Timeout returns), so
// that what the call hands back to outlive it, such as a reentrant owning context, derives
// from parent instead of ctx. ctx must derive from parent; marks nest to the outermost.
func WithOutliving(ctx, parent context.Context) context.Context {
	return context.WithValue(ctx, outlivingKey{}, Outliving(parent))
}

// Outliving is the context in ctx to derive what outlives a call from: the parent that
// WithOutliving marked, else ctx itself.
func Outliving(ctx context.Context) context.Context {
	if p, ok := ctx.Value(outlivingKey{}).(context.Context); ok {
		return p
	}
	return ctx
}

// Why a session ended: the cause of its context, and the detail of the ErrLost of every
// hold and wait on it.
var (
	errDeadline     = errors.New("no renewal of the session's lease got through before its local deadline")
	errLeaseGone    = errors.New("etcd says the session's lease is gone (expired or revoked)")
	errShutdown     = errors.New("the session's lease was revoked by Shutdown")
	errClientClosed = errors.New("the etcd client was closed")
	errRetired      = errors.New("the session was retired")
	errCallerEnded  = errors.New("the session given with WithSession ended")
	// errKeepAliveStopped: the keep-alive returned while nothing else had ended the session;
	// no path does, but a hold on a lease that nobody renews must not live on.
	errKeepAliveStopped = errors.New("the session's keep-alive stopped")
)

// authRefusal reports whether etcd refused a watch for the stream's credentials: a token
// issued before a change to the auth store, or one that expired. etcd 3.4 says "permission
// denied" for those too; a permission that is really missing fails the read as well.
func authRefusal(reason string) bool {
	for _, r := range []error{rpctypes.ErrGRPCAuthOldRevision, rpctypes.ErrGRPCInvalidAuthToken,
		rpctypes.ErrGRPCUserEmpty, rpctypes.ErrGRPCPermissionDenied} {
		if strings.Contains(reason, rpctypes.ErrorDesc(r)) {
			return true
		}
	}
	return false
}

// tokenRefusals are etcd's refusals of a client's login or token.
var tokenRefusals = []error{rpctypes.ErrInvalidAuthToken, rpctypes.ErrAuthOldRevision, rpctypes.ErrAuthFailed,
	rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound}

// tokenRefused reports whether err is etcd refusing the client's login or token (invalid or
// expired, of an old auth revision).
func tokenRefused(err error) bool {
	if err == nil {
		return false
	}
	err = rpctypes.Error(err)
	return slices.ContainsFunc(tokenRefusals, func(r error) bool { return errors.Is(err, r) }) ||
		status.Code(err) == codes.Unauthenticated
}

// authRefused reports whether err is etcd refusing the client's login, its token or a
// permission.
func authRefused(err error) bool {
	return tokenRefused(err) || errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) ||
		status.Code(err) == codes.PermissionDenied
}

// deadlineCause is why a session ended at its local deadline: errDeadline, with why the
// renewals tried since the last one that got through failed (no leader, an expired auth
// token, a permission, no answer in time), so that the loss says what an operator can fix.
func deadlineCause(failed error) error {
	switch {
	case failed == nil:
		return errDeadline
	case errors.Is(failed, context.DeadlineExceeded):
		return fmt.Errorf("%w (the last try got no answer in time)", errDeadline)
	case authRefused(failed):
		return fmt.Errorf("%w (the renewals failed: %w)", errDeadline, failed)
	}
	return fmt.Errorf("%w (the last try failed: %v)", errDeadline, failed)
}

// errDeletedWhileWaiting is why a wait whose own key was deleted failed.
var errDeletedWhileWaiting = errors.New("deleted while waiting")

// What a public handle answers when it cannot serve a call at all: it was not made by New
// (a zero value or a nil pointer: no queue), or its client is closed, where etcd's client
// would retry a request until the caller's ctx ends instead of failing it.
var (
	errUnmade             = fmt.Errorf("%w: a handle not made by New (a zero value or a nil pointer)", ErrInvalidOption)
	errClientClosedOption = fmt.Errorf("%w: the etcd client is closed", ErrInvalidOption)
)

// clientUnusable is the part of Unusable every handle made by New shares: its client closed.
func clientUnusable(cli *clientv3.Client) error {
	if cli.Ctx().Err() != nil {
		return errClientClosedOption
	}
	return nil
}

// errKeyDeleted is why a hold whose key is no longer the one it created was lost.
var errKeyDeleted = errors.New("deleted, or gone with its lease")

// ErrAsked: someone asked the hold to let go (admin.Ask, etcdsync ask). It is no loss: the
// hold lasts until it is released.
var ErrAsked = errors.New("etcdsync: asked to let go")
