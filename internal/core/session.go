package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel/metric"
)

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

// Session is the lease that acquisitions bind their keys to, and when it ends.
type Session struct {
	id      clientv3.LeaseID
	cluster uint64          // the ID of the cluster that granted the lease; 0 for a caller's session
	ctx     context.Context // ends with the session; context.Cause says why
	end     context.CancelCauseFunc
	ka      *keepAlive // nil for a caller's session (WithSession)

	mu      sync.Mutex
	users   int  // slots claimed on the lease (see claimSlot)
	retired bool // takes no new acquisition; revoked once users is 0
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

// unclaim counts one slot fewer; the last one out of a retired session has it revoked.
func (s *Session) unclaim() {
	s.mu.Lock()
	s.users--
	last := s.retired && s.users == 0
	s.mu.Unlock()
	if last && s.ka != nil {
		s.ka.retire()
	}
}

// retire takes the session out of use for new acquisitions: a write on it may be applied
// late, after its cleanup found nothing to remove, and only the lease's revocation removes
// such a key for sure. The lease is revoked once no slot is claimed on it.
func (s *Session) retire() {
	s.mu.Lock()
	first := !s.retired
	s.retired = true
	idle := s.users == 0
	s.mu.Unlock()
	if first && idle && s.ka != nil {
		s.ka.retire()
	}
}

func (s *Session) isRetired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired
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
	resp, err := retry(ctx, func() (*clientv3.LeaseGrantResponse, error) {
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
// to go. Each revoke is retried through leader changes until ctx ends. An acquisition under way on a revoked lease fails with ErrLost: it never moves to a
// new lease. The next acquisition on cli grants a new lease. Sessions given with WithSession
// are the caller's to close.
func Shutdown(ctx context.Context, cli *clientv3.Client) error {
	var errs []error
	for _, s := range sharedOf(cli) {
		for _, sess := range s.take() {
			sess.end(errShutdown) // first: an acquisition that then finds the lease gone knows why
			sess.ka.stop()
			_, err := retry(ctx, func() (*clientv3.LeaseRevokeResponse, error) {
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
		s.ins = newInstruments(mp)
	}
}

func (s *sharedSession) metrics() *instruments {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ins
}
