package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Session is the lease that acquisitions bind their keys to, and when it ends.
type Session struct {
	id   clientv3.LeaseID
	done <-chan struct{}
	ctx  context.Context // ends with the session (a caller's: when it is closed)
	ka   *keepAlive      // nil for a caller's session (WithSession)
}

// Lease is the session's lease.
func (s *Session) Lease() clientv3.LeaseID { return s.id }

// Done is closed when the lease is gone or may be: for the shared session, at the latest
// at its local deadline (see keepAlive), before etcd can have let the lease expire.
func (s *Session) Done() <-chan struct{} { return s.done }

// Sessions hands out the session whose lease an acquisition writes its key under.
type Sessions interface {
	// Session returns a live session; it may grant a lease (one RPC) when there is none.
	Session(ctx context.Context) (*Session, error)
	// Expired tells the source that s was found dead (its lease is gone), so that the next
	// Session call does not return it again.
	Expired(s *Session)
}

// SessionsFor returns the session source of a primitive on cli configured by c: the
// caller's own session, or the one shared by every primitive on cli with the same TTL.
func SessionsFor(cli *clientv3.Client, c Config) Sessions {
	if c.Session != nil {
		cs := c.Session
		return fixedSession{cs, &Session{id: cs.Lease(), done: cs.Done(), ctx: cs.Ctx()}}
	}
	return shared(cli, int64(c.TTL/time.Second))
}

// fixedSession is a caller's session, used untouched: never replaced, never closed, and
// its end known only when its own keep-alive reports it.
type fixedSession struct {
	cs *concurrency.Session
	s  *Session
}

func (f fixedSession) Session(context.Context) (*Session, error) {
	select {
	case <-f.cs.Done():
		return nil, fmt.Errorf("%w: the session given with WithSession has expired", ErrLost)
	default:
		return f.s, nil
	}
}

func (fixedSession) Expired(*Session) {}

type sharedKey struct {
	cli *clientv3.Client
	ttl int64
}

var (
	sharedMu sync.Mutex
	sharedBy = map[sharedKey]*sharedSession{}
)

// shared returns the one sharedSession of cli and ttl. It does no I/O; the entry is
// dropped when the client closes, so the map never keeps a closed client alive.
func shared(cli *clientv3.Client, ttl int64) *sharedSession {
	k := sharedKey{cli, ttl}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s, ok := sharedBy[k]; ok {
		return s
	}
	s := &sharedSession{cli: cli, ttl: ttl, grant: make(chan struct{}, 1)}
	sharedBy[k] = s
	context.AfterFunc(cli.Ctx(), func() {
		sharedMu.Lock()
		delete(sharedBy, k)
		sharedMu.Unlock()
	})
	return s
}

// sharedSession is one lease and one keep-alive for every primitive on a client and TTL.
// Its keep-alive goroutine ends when the lease expires, is presumed expired, is revoked or
// the client closes; an ended session is replaced at the next Session call.
type sharedSession struct {
	cli   *clientv3.Client
	ttl   int64
	grant chan struct{} // held while one caller grants a lease; others wait on it or their ctx

	mu  sync.Mutex
	cur *Session
}

func (s *sharedSession) live() *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	select {
	case <-s.cur.done:
		s.cur = nil
		return nil
	default:
		return s.cur
	}
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
	// Grant under the caller's ctx, which a caller can cancel; the keep-alive then runs for
	// the client's lifetime. The lease lives at least until the send time plus its TTL.
	sent := time.Now()
	resp, err := s.cli.Grant(clientv3.WithRequireLeader(ctx), s.ttl)
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	sess := startKeepAlive(s.cli, resp.ID, sent, time.Duration(resp.TTL)*time.Second)
	s.mu.Lock()
	s.cur = sess
	s.mu.Unlock()
	return sess, nil
}

func (s *sharedSession) Expired(dead *Session) {
	s.mu.Lock()
	if s.cur == dead {
		s.cur = nil
	}
	s.mu.Unlock()
	dead.ka.stop() // the lease is gone already: nothing to revoke
}

// take removes the current session, if any, so that the next acquisition grants a new one.
func (s *sharedSession) take() *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.cur
	s.cur = nil
	return cur
}

// Shutdown revokes the leases shared by the primitives on cli (one per TTL in use), so that
// every hold and waiting acquisition on them ends at once (Done closes, Err says ErrLost)
// and other clients need not wait a TTL for their keys to go. The next acquisition on cli
// grants a new lease. Sessions given with WithSession are the caller's to close.
func Shutdown(ctx context.Context, cli *clientv3.Client) error {
	sharedMu.Lock()
	var mine []*sharedSession
	for k, s := range sharedBy {
		if k.cli == cli {
			mine = append(mine, s)
		}
	}
	sharedMu.Unlock()
	var errs []error
	for _, s := range mine {
		cur := s.take()
		if cur == nil {
			continue
		}
		cur.ka.stop()
		if _, err := cli.Revoke(ctx, cur.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, fmt.Errorf("revoke lease %x: %w", int64(cur.id), err))
		}
	}
	return errors.Join(errs...)
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

// keepAlive renews one lease with the client's KeepAliveOnce, a third of the TTL after the
// last renewal was sent, and ends the session at the lease's local deadline unless a renewal
// sent since has moved it on. A renewal that fails is retried at once (after a short pause)
// until the deadline. Once the deadline has passed, the lease is revoked as soon as etcd
// answers: the holds on it were told they lost, so their keys must not hold up others.
type keepAlive struct {
	cli    *clientv3.Client
	id     clientv3.LeaseID
	end    context.CancelFunc // ends the session: its Done closes
	ctx    context.Context    // ended by stop or the client's close
	cancel context.CancelFunc
	exited chan struct{}

	mu       sync.Mutex
	deadline time.Time
}

// renewRetry is the pause after a renewal that failed at once.
const renewRetry = 50 * time.Millisecond

func startKeepAlive(cli *clientv3.Client, id clientv3.LeaseID, sent time.Time, ttl time.Duration) *Session {
	ctx, cancel := context.WithCancel(cli.Ctx())
	life, end := context.WithCancel(context.Background())
	k := &keepAlive{cli: cli, id: id, end: end, ctx: ctx, cancel: cancel,
		exited: make(chan struct{}), deadline: sent.Add(ttl - Margin(ttl))}
	go k.run(sent, ttl)
	return &Session{id: id, done: life.Done(), ctx: life, ka: k}
}

// stop ends the keep-alive without revoking the lease, and waits for it.
func (k *keepAlive) stop() {
	k.cancel()
	<-k.exited
}

// Deadline is the lease's local deadline: the session ends then unless renewed meanwhile.
func (k *keepAlive) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}

func (k *keepAlive) run(sent time.Time, ttl time.Duration) {
	defer close(k.exited)
	defer k.cancel()
	defer k.end()
	deadline := k.Deadline()
	expiry := time.NewTimer(time.Until(deadline))
	defer expiry.Stop()
	next := time.NewTimer(time.Until(sent.Add(ttl / 3)))
	defer next.Stop()
	for {
		select {
		case <-expiry.C:
			k.end()
			k.revoke()
			return
		case <-k.ctx.Done():
			k.end()
			return
		case <-next.C:
		}
		now := time.Now()
		if !now.Before(deadline) {
			k.end()
			k.revoke()
			return
		}
		until := now.Add(ttl / 3)
		if deadline.Before(until) {
			until = deadline
		}
		actx, cancel := context.WithDeadline(k.ctx, until)
		resp, err := k.cli.KeepAliveOnce(actx, k.id)
		cancel()
		switch {
		case err == nil:
			ttl = time.Duration(resp.TTL) * time.Second
			deadline = now.Add(ttl - Margin(ttl))
			k.mu.Lock()
			k.deadline = deadline
			k.mu.Unlock()
			expiry.Reset(time.Until(deadline))
			next.Reset(time.Until(now.Add(ttl / 3)))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			k.end() // expired or revoked: etcd said so
			return
		default:
			next.Reset(renewRetry)
		}
	}
}

// revoke revokes the lease whose local deadline passed, retrying until etcd answers or the
// client closes: until then the lease may live on in etcd, and with it the keys of holds
// that were told they lost.
func (k *keepAlive) revoke() {
	var b backoff
	for {
		ctx, cancel := context.WithTimeout(k.ctx, cleanupTimeout)
		_, err := k.cli.Revoke(ctx, k.id)
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
