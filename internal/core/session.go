package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Sessions hands out the etcd session whose lease an acquisition writes its key under.
type Sessions interface {
	// Session returns a live session; it may grant a lease (one RPC) when there is none.
	Session(ctx context.Context) (*concurrency.Session, error)
	// Expired tells the source that s was found dead (its lease is gone), so that the next
	// Session call does not return it again.
	Expired(s *concurrency.Session)
}

// SessionsFor returns the session source of a primitive on cli configured by c: the
// caller's own session, or the one shared by every primitive on cli with the same TTL.
func SessionsFor(cli *clientv3.Client, c Config) Sessions {
	if c.Session != nil {
		return fixedSession{c.Session}
	}
	return shared(cli, int64(c.TTL/time.Second))
}

// fixedSession is a caller's session, used untouched: never replaced, never closed.
type fixedSession struct{ s *concurrency.Session }

func (f fixedSession) Session(context.Context) (*concurrency.Session, error) {
	select {
	case <-f.s.Done():
		return nil, fmt.Errorf("%w: the session given with WithSession has expired", ErrLost)
	default:
		return f.s, nil
	}
}

func (fixedSession) Expired(*concurrency.Session) {}

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
// Its keep-alive goroutine (concurrency.Session's) ends when the lease expires or the
// client closes; an expired session is replaced at the next Session call.
type sharedSession struct {
	cli   *clientv3.Client
	ttl   int64
	grant chan struct{} // held while one caller grants a lease; others wait on it or their ctx

	mu  sync.Mutex
	cur *concurrency.Session
}

func (s *sharedSession) live() *concurrency.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	select {
	case <-s.cur.Done():
		s.cur = nil
		return nil
	default:
		return s.cur
	}
}

func (s *sharedSession) Session(ctx context.Context) (*concurrency.Session, error) {
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
	// Grant under the caller's ctx (etcd's NewSession would grant under the client's, which
	// a caller cannot cancel); the keep-alive then runs for the client's lifetime.
	resp, err := s.cli.Grant(clientv3.WithRequireLeader(ctx), s.ttl)
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	sess, err := concurrency.NewSession(s.cli, concurrency.WithLease(resp.ID), concurrency.WithTTL(int(s.ttl)))
	if err != nil {
		return nil, fmt.Errorf("keep lease alive: %w", err)
	}
	s.mu.Lock()
	s.cur = sess
	s.mu.Unlock()
	return sess, nil
}

func (s *sharedSession) Expired(dead *concurrency.Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == dead {
		s.cur = nil
		dead.Orphan() // stop its keep-alive; the lease is gone already
	}
}
