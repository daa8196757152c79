package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
)

// Session is the lease that acquisitions bind their keys to, and when it ends.
type Session struct {
	id      clientv3.LeaseID
	cluster uint64          // the ID of the cluster that granted the lease; 0 for a caller's session
	ctx     context.Context // ends with the session; context.Cause says why
	end     context.CancelCauseFunc
	ka      *keepAlive // nil for a caller's session (WithSession)

	mu      sync.Mutex
	users   int       // slots claimed on the lease (see claimSlot)
	retired bool      // takes no new acquisition; revoked once users is 0
	full    bool      // retired for holding maxLeaseKeys: let go, not revoked, once users is 0
	gone    bool      // etcd said the lease is gone (leaseGone)
	asking  *leaseAsk // a read of whether the lease is gone, under way; nil for none
}

// leaseAsk is a read of whether a session's lease is gone, whose answer every hold that
// asked while it was under way takes (leaseGone).
type leaseAsk struct {
	done chan struct{} // closed once answered
	gone bool
}

// Lease is the session's lease.
func (s *Session) Lease() clientv3.LeaseID { return s.id }

// Done is closed when the lease is gone or may be: for the shared session, at the latest at
// its local deadline (see keepAlive), before etcd can have let the lease expire.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// ended reports whether the session has ended.
func (s *Session) ended() bool { return s.ctx.Err() != nil }

// lostErr is nil while the session lives, else ErrLost with why it ended.
func (s *Session) lostErr() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrLost, s.cause())
}

// cause says why the session ended, nil while it lives.
func (s *Session) cause() error {
	if s.ctx.Err() == nil {
		return nil
	}
	if c := context.Cause(s.ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return errCallerEnded
}

// endedBy reports whether the session ended for cause.
func (s *Session) endedBy(cause error) bool { return errors.Is(s.cause(), cause) }

// claim counts one more slot on the lease.
func (s *Session) claim() {
	s.mu.Lock()
	s.users++
	s.mu.Unlock()
}

// unclaim counts one slot fewer; the last one out of a retired session has it revoked, or,
// for a full one, no longer renewed: its keys are gone, and a revoke would make its last
// releases look to a waiter with WithLockDelay like keys that went with their lease.
func (s *Session) unclaim() {
	s.mu.Lock()
	s.users--
	last := s.retired && s.users == 0
	full := s.full
	s.mu.Unlock()
	if last {
		s.letGo(full)
	}
}

// letGo ends a retired session on which no slot is claimed any more: it revokes the lease,
// or, for a full one, only stops renewing it.
func (s *Session) letGo(full bool) {
	switch {
	case s.ka == nil:
	case full:
		s.ka.cancel()
	default:
		s.ka.retire()
	}
}

// maxLeaseKeys bounds the keys of a shared lease: once that many slots are claimed on it,
// the next acquisition takes a new lease. When a lease ends, etcd deletes its keys in one
// apply, which stalls every other write on the cluster for as long (see
// docs/performance.md); the bound keeps that stall short however many holds a client has.
// An acquisition of several names puts all its keys on one lease, so a lease may carry up
// to MaxNames-1 more. A var for the tests (SetMaxLeaseKeys).
var maxLeaseKeys atomic.Int64

func init() { maxLeaseKeys.Store(10_000) }

// isFull reports whether the session has maxLeaseKeys slots claimed.
func (s *Session) isFull() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(s.users) >= maxLeaseKeys.Load()
}

// retire takes the session out of use for new acquisitions: a write on it may be applied
// late, after its cleanup found nothing to remove, and only the lease's revocation removes
// such a key for sure. The lease is revoked once no slot is claimed on it; a full one's
// (see maxLeaseKeys) is no longer renewed then.
func (s *Session) retire() { s.retireAs(false) }

// retireAs retires the session, as full (see maxLeaseKeys) or not.
func (s *Session) retireAs(full bool) {
	s.mu.Lock()
	first := !s.retired
	s.retired = true
	s.full = s.full || full
	idle, full := s.users == 0, s.full
	s.mu.Unlock()
	if first && idle {
		s.letGo(full)
	}
}

// idle reports whether no slot is claimed on the lease and it is not retired: it carries
// no key of this process's.
func (s *Session) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users == 0 && !s.retired
}

func (s *Session) isRetired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired
}

// shared returns the one sharedSession of cli and ttl. It does no I/O.
func shared(cli *clientv3.Client, ttl int64) *sharedSession {
	st := stateOf(cli)
	st.mu.Lock()
	defer st.mu.Unlock()
	if s, ok := st.shared[ttl]; ok {
		return s
	}
	s := &sharedSession{cli: cli, ttl: ttl, grant: make(chan struct{}, 1)}
	st.shared[ttl] = s
	return s
}

// sharedSession is one lease and one keep-alive for every primitive on a client and TTL.
// Its keep-alive goroutine ends when the lease expires, is presumed expired, is revoked or
// the client closes; an ended session is replaced at the next Session call. A retired
// session is replaced too, and lives on beside the new one until its last slot is freed.
type sharedSession struct {
	cli   *clientv3.Client
	ttl   int64
	grant chan struct{} // held while one caller grants a lease; others wait on it or their ctx

	mu      sync.Mutex
	cur     *Session
	retired []*Session   // retired sessions whose lease is not yet revoked
	ins     *instruments // counts renewals: the first primitive's on the client and TTL
}

func (s *sharedSession) live() *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil && (s.cur.ended() || s.cur.isRetired()) {
		s.cur = nil
	}
	if s.cur != nil && s.cur.isFull() {
		// Full: it takes no new acquisition, and lives on beside the next until its
		// last slot is freed.
		full := s.cur
		s.cur = nil
		s.retired = append(slices.DeleteFunc(s.retired, (*Session).ended), full)
		full.retireAs(true)
	}
	return s.cur
}

func (s *sharedSession) Session(ctx context.Context) (*Session, error) {
	if cur := s.live(); cur != nil {
		return cur, nil
	}
	select {
	case s.grant <- struct{}{}:
		defer func() { <-s.grant }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if cur := s.live(); cur != nil { // granted by the caller we waited for
		return cur, nil
	}
	// The lease lives at least until the send time plus its TTL.
	sent := time.Now()
	seen := clockOf(s.cli).now()
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return s.cli.Grant(clientv3.WithRequireLeader(ctx), s.ttl)
	})
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	if err := clockOf(s.cli).linear(resp.ResponseHeader, seen); err != nil {
		rewind(s.cli, err) // what was granted before is void; this lease is of the new life
		// Unless answers come from two clusters: the next request may go to the other one.
		if errors.Is(err, ErrMixedClusters) {
			revokeOn(ctx, s.cli, clustersOf(ctx, s.cli)[resp.ResponseHeader.ClusterId], resp.ID)
			return nil, fmt.Errorf("grant lease: %w", err)
		}
	}
	sess := startKeepAlive(s.cli, resp.ID, sent, time.Duration(resp.TTL)*time.Second, s.metrics())
	sess.cluster = resp.ResponseHeader.ClusterId
	s.mu.Lock()
	s.cur = sess
	s.mu.Unlock()
	return sess, nil
}

// Expired ends dead without revoking its lease, which etcd said is gone. Unless the
// endpoints are members of different clusters: the answer then came from a cluster other
// than the one that granted the lease, which keeps it; so Expired asks every endpoint for
// its cluster (clustersOf), and on a mix revokes the lease on the cluster that granted it.
func (s *sharedSession) Expired(ctx context.Context, dead *Session) error {
	s.mu.Lock()
	if s.cur == dead {
		s.cur = nil
	}
	s.mu.Unlock()
	dead.end(errLeaseGone)
	dead.ka.stop()
	found := clustersOf(ctx, s.cli)
	err := mixedClusters(found)
	if err != nil && len(found[dead.cluster]) > 0 {
		revokeOn(ctx, s.cli, found[dead.cluster], dead.id)
	}
	return err
}

func (s *sharedSession) Retire(sess *Session) {
	s.mu.Lock()
	if s.cur == sess {
		s.cur = nil
	}
	s.retired = append(slices.DeleteFunc(s.retired, (*Session).ended), sess)
	s.mu.Unlock()
	sess.retire()
}

// take removes every session, current and retired, so that the next acquisition grants a
// new one.
func (s *sharedSession) take() []*Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := s.retired
	s.retired = nil
	if s.cur != nil {
		all = append(all, s.cur)
		s.cur = nil
	}
	return all
}

// Shutdown revokes the leases shared by the primitives on cli (one per TTL in use, and any
// retired one not yet revoked), so that every hold and waiting acquisition on them ends at
// once (Done closes, Err says ErrLost) and other clients need not wait a TTL for their keys
// to go. Each revoke is retried through leader changes until ctx ends. An acquisition under
// way on a revoked lease fails with ErrLost: it never moves to a new lease. The next
// acquisition on cli grants a new lease. Sessions given with WithSession are the caller's
// to close.
//
// A lease on which no slot is claimed (every hold released, nobody waiting) carries no key
// of ours: it is not revoked, only no longer renewed, and expires after its TTL. So a
// release followed by Shutdown, as a process does on its way out, never looks to a waiter
// with WithLockDelay like a key that went with its lease (see life.go).
func Shutdown(ctx context.Context, cli *clientv3.Client) error {
	var errs []error
	for _, s := range sharedOf(cli) {
		for _, sess := range s.take() {
			// Before the end: the holds it ends give their slots back, keys and all.
			idle := sess.idle()
			sess.end(errShutdown) // first: an acquisition that then finds the lease gone knows why
			sess.ka.stop()
			if idle {
				continue
			}
			_, err := Retry(ctx, func(ctx context.Context) (*clientv3.LeaseRevokeResponse, error) {
				return cli.Revoke(clientv3.WithRequireLeader(ctx), sess.id)
			})
			if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				errs = append(errs, fmt.Errorf("revoke lease %x: %w", int64(sess.id), err))
			}
		}
	}
	return errors.Join(errs...)
}

// sharedOf returns the shared sessions of cli, one per TTL in use.
func sharedOf(cli *clientv3.Client) []*sharedSession {
	st := stateOf(cli)
	st.mu.Lock()
	defer st.mu.Unlock()
	mine := make([]*sharedSession, 0, len(st.shared))
	for _, s := range st.shared {
		mine = append(mine, s)
	}
	return mine
}

// meter makes the session count its renewals through mp's instruments (the global
// MeterProvider's if nil), unless an earlier primitive on the client and TTL chose already:
// the lease is shared, so its renewals are counted once.
func (s *sharedSession) meter(mp metric.MeterProvider) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ins == nil {
		s.ins = instrumentsFor(mp)
	}
}

func (s *sharedSession) metrics() *instruments {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ins
}

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
	var b Backoff
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
			b = Backoff{}
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			k.end(errLeaseGone) // expired or revoked: etcd said so
			return
		default:
			next.Reset(min(b.Next(), 250*time.Millisecond))
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

// revoke revokes the lease, retrying until etcd answers or the client closes: until then
// the lease may live on in etcd, and with it the keys of holds that were told they lost.
func (k *keepAlive) revoke() {
	var b Backoff
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
