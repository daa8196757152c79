package core

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cleanupTimeout bounds the detached context that removes the key of a cancelled or failed
// acquisition: long enough to ride out a leader election, short enough to keep a cancelled
// call prompt when etcd is unreachable (the key then goes with its lease).
const cleanupTimeout = 5 * time.Second

// detached returns a context that outlives ctx's cancellation by at most cleanupTimeout.
//
// A Txn that may write an acquisition's key runs on it, not on ctx: a Txn cancelled in
// flight may still be applied by etcd after the client gave up, and then possibly after the
// delete meant to undo it, which would leave a key that queues ahead of every later waiter
// for as long as the shared lease lives. Waiting for its answer orders the delete after it;
// a caller whose ctx ends meanwhile waits for that answer (a round trip, at most
// cleanupTimeout when etcd is unreachable).
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// Detached is detached, for the public packages' own cleanups: a context that outlives
// ctx's cancellation by at most 5 s.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) { return detached(ctx) }

// Every request of the core carries clientv3.WithRequireLeader: a member cut off from its
// quorum then refuses it at once (no leader: Unavailable, so retried, and the client's
// balancer sends the retry to another member) instead of holding it until its own timeout.

// transient reports whether err says only that etcd could not answer now (no leader, a
// leader change, a member out of reach), so the same request may be sent again.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if s, ok := status.FromError(err); ok {
		// Internal comes from gRPC's transport, never from etcd: a connection garbled on
		// its way (a reset stream, a protocol error), which a new connection gets past.
		return s.Code() == codes.Unavailable || s.Code() == codes.Internal
	}
	return errors.Is(err, errWatchClosed)
}

var errWatchClosed = errors.New("etcdsync: watch closed")

// retry calls call until it returns an error that is not transient (nil included) or ctx
// ends, backing off between tries; it returns the last call's result, or ctx's error if
// ctx ended during a pause.
func retry[T any](ctx context.Context, call func() (T, error)) (T, error) {
	var b backoff
	for {
		v, err := call()
		if !transient(err) || ctx.Err() != nil {
			return v, err
		}
		if err := b.wait(ctx); err != nil {
			return v, err
		}
	}
}

// commitWrite commits the Txn that build makes of a Txn that may write an acquisition's
// key, retried through transient errors. Each try runs on a detached context, to its
// answer (see detached). A Txn that was applied after ctx ended yields ctx's error: the
// caller, which may hold a key it no longer wants, removes it.
func commitWrite(ctx context.Context, cli *clientv3.Client, build func(clientv3.Txn) clientv3.Txn) (*clientv3.TxnResponse, error) {
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		tctx, cancel := detached(ctx)
		defer cancel()
		return build(cli.Txn(clientv3.WithRequireLeader(tctx))).Commit()
	})
	if err == nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return resp, err
}

// backoff spaces out retries after transient errors: 25 ms doubling to 1 s, with jitter.
type backoff struct{ next time.Duration }

func (b *backoff) wait(ctx context.Context) error {
	t := time.NewTimer(b.step())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// after returns a channel that yields after the next delay.
func (b *backoff) after() <-chan time.Time { return time.After(b.step()) }

func (b *backoff) step() time.Duration {
	if b.next == 0 {
		b.next = 25 * time.Millisecond
	}
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, time.Second)
	return d
}
