package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The local deadline of a shared lease. etcd's leader lets a lease expire no earlier than
// TTL after it received the last keep-alive that renewed it, which is after this process
// sent it. So the lease certainly lives until that send time plus the TTL, as long as the
// two clocks run at the same rate; the session ends locally a margin earlier, for a
// difference in clock rates of up to driftBound and for the time it takes this process to
// act on its timer. Holds learn of their loss then, before etcd can serve anyone else.
const (
	driftBound = 100                    // 1/100: clock rates differ by less than 1%
	actSlack   = 100 * time.Millisecond // this process's timer firing late, under load
)

// Margin is how long before the lease certainly lives no longer a shared session ends.
func Margin(ttl time.Duration) time.Duration { return ttl/driftBound + actSlack }

// renewTry bounds one renewal try of a lease with the TTL ttl: a member that holds it
// without an answer (a follower cut off from its leader that has not noticed yet) costs at
// most that much before the try goes to another member.
func renewTry(ttl time.Duration) time.Duration {
	return min(max(ttl/6, 300*time.Millisecond), 2*time.Second)
}

// keepAlive renews one lease, a third of the TTL after the last renewal was sent, and ends
// the session at the lease's local deadline unless a renewal sent since has moved it on. A
// renewal that fails is tried again after a short pause until the deadline. Once the
// deadline has passed, the lease is revoked as soon as etcd answers: the holds on it were
// told they lost, so their keys must not hold up others. A retired session's lease is
// revoked as well once it is idle.
type keepAlive struct {
	cli     *clientv3.Client
	id      clientv3.LeaseID
	end     context.CancelCauseFunc // ends the session: its Done closes
	ctx     context.Context         // ended by stop or the client's close
	cancel  context.CancelFunc
	retireC chan struct{} // closed by retire
	retired sync.Once
	exited  chan struct{}

	metrics *instruments // counts the renewals

	mu       sync.Mutex
	deadline time.Time
}

func startKeepAlive(cli *clientv3.Client, id clientv3.LeaseID, sent time.Time, ttl time.Duration, metrics *instruments) *Session {
	ctx, cancel := context.WithCancel(cli.Ctx())
	life, end := context.WithCancelCause(context.Background())
	k := &keepAlive{cli: cli, id: id, end: end, ctx: ctx, cancel: cancel, retireC: make(chan struct{}),
		exited: make(chan struct{}), deadline: sent.Add(ttl - Margin(ttl)), metrics: metrics}
	go k.run(sent, ttl)
	return &Session{id: id, ctx: life, end: end, ka: k}
}

// stop ends the keep-alive without revoking the lease, and waits for it.
func (k *keepAlive) stop() {
	k.cancel()
	<-k.exited
}

// retire has the keep-alive end the session and revoke the lease.
func (k *keepAlive) retire() { k.retired.Do(func() { close(k.retireC) }) }

// Deadline is the lease's local deadline: the session ends then unless renewed meanwhile.
func (k *keepAlive) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}

func (k *keepAlive) run(sent time.Time, ttl time.Duration) {
	defer close(k.exited)
	defer k.cancel()
	defer func() {
		// If nothing else ended it: the client's close, or a stop. Stop is called only once
		// the session has ended for a cause of its own; any other way out of this loop still
		// ends the session, so that no hold lives on a lease nobody renews.
		if k.cli.Ctx().Err() != nil {
			k.end(errClientClosed)
		}
		k.end(errKeepAliveStopped)
	}()
	deadline := k.Deadline()
	expiry := time.NewTimer(time.Until(deadline))
	defer expiry.Stop()
	next := time.NewTimer(time.Until(sent.Add(ttl / 3)))
	defer next.Stop()
	var b backoff
	var failed error // why the renewals since the last one that got through failed
	for {
		select {
		case <-expiry.C:
			k.end(deadlineCause(failed))
			k.revoke()
			return
		case <-k.retireC:
			k.end(errRetired)
			k.revoke()
			return
		case <-k.ctx.Done():
			return
		case <-next.C:
		}
		now := time.Now()
		if !now.Before(deadline) {
			k.end(deadlineCause(failed))
			k.revoke()
			return
		}
		tryEnd := now.Add(renewTry(ttl))
		if deadline.Before(tryEnd) {
			tryEnd = deadline
		}
		actx, cancel := context.WithDeadline(k.ctx, tryEnd)
		granted, hdr, err := k.renewOnce(actx)
		if clockOf(k.cli).suspect(hdr) { // also on ErrLeaseNotFound: a lease gone in a restore
			if rw := clockOf(k.cli).confirm(actx, k.cli); rw != nil {
				cancel()
				rewind(k.cli, rw) // ends this session too, and has its lease revoked
				continue
			}
		}
		cancel()
		if k.ctx.Err() == nil { // not a try cut short by stop or the client's close
			k.metrics.renewal(err == nil)
		}
		if err != nil {
			failed = k.whyFailed(err, failed, earliest(deadline, time.Now().Add(renewTry(ttl)/2)))
		}
		switch {
		case err == nil:
			failed = nil
			ttl = time.Duration(granted) * time.Second
			deadline = now.Add(ttl - Margin(ttl))
			k.mu.Lock()
			k.deadline = deadline
			k.mu.Unlock()
			expiry.Reset(time.Until(deadline))
			next.Reset(time.Until(now.Add(ttl / 3)))
			b = backoff{}
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			k.end(errLeaseGone) // expired or revoked: etcd said so
			return
		default:
			next.Reset(min(b.step(), 250*time.Millisecond))
		}
	}
}

// renewOnce renews the lease once, on a stream of its own that requires a leader: a member
// without one refuses at once, and the next try goes to another member, instead of holding
// the renewal until the try's time is up. It returns the TTL granted and the answer's
// header, or ErrLeaseNotFound.
func (k *keepAlive) renewOnce(ctx context.Context) (ttl int64, hdr *pb.ResponseHeader, err error) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stream, err := pb.NewLeaseClient(k.cli.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		return 0, nil, rpctypes.Error(err)
	}
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(k.id)}); err != nil {
		return 0, nil, rpctypes.Error(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0, nil, rpctypes.Error(err)
	}
	_ = stream.CloseSend()
	if resp.TTL <= 0 {
		return 0, resp.Header, rpctypes.ErrLeaseNotFound
	}
	return resp.TTL, resp.Header, nil
}

// whyFailed is why the renewals since the last one that got through failed, now that a
// try failed with err and before was why: err, unless it got no answer in time. An expired
// simple token hides behind that: clientv3 logs in again before every stream, and against
// etcd 3.4 its login sends the expired token along and is refused, again and again until
// the try's time is up. So, on the first try of a run that times out, one unary read (a
// count of no key, as clock.confirm's), bounded by until, shows what etcd answers first
// (grpc.OnFinish sees each of the client's attempts): a refused token is kept as the cause
// from then on. A member that does not answer costs the next try that bound.
func (k *keepAlive) whyFailed(err, before error, until time.Time) error {
	switch {
	case !errors.Is(err, context.DeadlineExceeded):
		return err
	case authRefused(before):
		return before
	case errors.Is(before, context.DeadlineExceeded):
		return err // looked already, and etcd did not refuse the token
	}
	ctx, cancel := context.WithDeadline(k.ctx, until)
	first := make(chan error, 1)
	onFinish := grpc.OnFinish(func(err error) {
		select {
		case first <- err:
		default:
		}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = pb.NewKVClient(k.cli.ActiveConnection()).Range(ctx, &pb.RangeRequest{Key: []byte(clockKey), CountOnly: true}, onFinish)
	}()
	defer func() { cancel(); <-done }() // the client's logins go on until then
	select {
	case answer := <-first:
		if tokenRefused(answer) {
			return fmt.Errorf("etcd refused the client's auth token: %w", rpctypes.Error(answer))
		}
	case <-ctx.Done():
	}
	return err
}

// earliest is the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
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

// revoke revokes the lease, retrying until etcd answers or the client closes: until then
// the lease may live on in etcd, and with it the keys of holds that were told they lost.
func (k *keepAlive) revoke() {
	var b backoff
	for {
		ctx, cancel := context.WithTimeout(k.ctx, tryTimeout)
		_, err := k.cli.Revoke(clientv3.WithRequireLeader(ctx), k.id)
		cancel()
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || k.ctx.Err() != nil {
			return
		}
		if !transient(err) && !errors.Is(err, context.DeadlineExceeded) {
			return // refused for good (permission): the lease goes when its TTL runs out
		}
		if b.wait(k.ctx) != nil {
			return
		}
	}
}
