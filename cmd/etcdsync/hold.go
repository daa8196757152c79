//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// acquirer takes what a subcommand holds: a lock, a read lock, a permit or leadership.
type acquirer interface {
	// acquire waits its turn, FIFO, until ctx ends.
	acquire(ctx context.Context) (hold, error)
	// try takes it only if that needs no wait, else returns an error matching errBusy.
	try(ctx context.Context) (hold, error)
}

// hold is what was acquired, until released or lost.
type hold interface {
	Key() string
	Token() int64
	Done() <-chan struct{}
	Err() error
	release(ctx context.Context) error
}

// errBusy is what a try that found the name busy returns, whatever the primitive.
var errBusy = errors.New("busy")

// busy maps the primitives' "a try found it busy" errors to errBusy.
func busy(err error) error {
	if core.Busy(err) {
		return fmt.Errorf("%w: %w", errBusy, err)
	}
	return err
}

// lock is `etcdsync lock`: a mutex.
type lock struct{ m *mutex.Mutex }

type lockHold struct{ *mutex.Mutex }

func (l lock) acquire(ctx context.Context) (hold, error) {
	if err := l.m.Lock(ctx); err != nil {
		return nil, err
	}
	return lockHold{l.m}, nil
}

func (l lock) try(ctx context.Context) (hold, error) {
	if err := l.m.TryLock(ctx); err != nil {
		return nil, busy(err)
	}
	return lockHold{l.m}, nil
}

func (h lockHold) release(ctx context.Context) error { return h.Unlock(ctx) }

// multiLock is `etcdsync lock` of several names: a mutex.Multi. Its Key is its keys, one
// per line, in the order of its names.
type multiLock struct{ m *mutex.Multi }

type multiHold struct{ *mutex.Multi }

func (l multiLock) acquire(ctx context.Context) (hold, error) {
	if err := l.m.Lock(ctx); err != nil {
		return nil, err
	}
	return multiHold{l.m}, nil
}

func (l multiLock) try(ctx context.Context) (hold, error) {
	if err := l.m.TryLock(ctx); err != nil {
		return nil, busy(err)
	}
	return multiHold{l.m}, nil
}

func (h multiHold) Key() string                       { return strings.Join(h.Keys(), "\n") }
func (h multiHold) release(ctx context.Context) error { return h.Unlock(ctx) }

// readLock is `etcdsync rlock`: the read side of an rwmutex.
type readLock struct {
	rw      *rwmutex.RWMutex
	cli     *clientv3.Client
	timeout time.Duration // of the release when the token cannot be read
}

// readHold is a read hold. Its token is its key's create revision, read once it is held:
// RWMutex.Token is the write hold's. It fences nothing against other readers, but it
// tells the command's own fenced writes (compare the key's create revision) whether the
// read hold still lasts.
type readHold struct {
	rw    *rwmutex.RWMutex
	token int64
}

func (r readLock) acquire(ctx context.Context) (hold, error) {
	if err := r.rw.RLock(ctx); err != nil {
		return nil, err
	}
	return r.held(ctx)
}

func (r readLock) try(ctx context.Context) (hold, error) {
	if err := r.rw.TryRLock(ctx); err != nil {
		return nil, busy(err)
	}
	return r.held(ctx)
}

// held reads the create revision of the read key just acquired: one Range. A key that is
// gone already is a read hold lost; Done tells that.
func (r readLock) held(ctx context.Context) (hold, error) {
	h := &readHold{rw: r.rw}
	key := r.rw.Key()
	resp, err := r.cli.Get(clientv3.WithRequireLeader(ctx), key, clientv3.WithKeysOnly())
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
		defer cancel()
		_ = h.release(rctx)
		return nil, fmt.Errorf("read the token of %s: %w", key, err)
	}
	if len(resp.Kvs) == 1 {
		h.token = resp.Kvs[0].CreateRevision
	}
	return h, nil
}

func (h *readHold) Key() string                       { return h.rw.Key() }
func (h *readHold) Token() int64                      { return h.token }
func (h *readHold) Done() <-chan struct{}             { return h.rw.Done() }
func (h *readHold) Err() error                        { return h.rw.Err() }
func (h *readHold) Asked() <-chan struct{}            { return h.rw.Asked() }
func (h *readHold) release(ctx context.Context) error { return h.rw.RUnlock(ctx) }

// permits is `etcdsync sem`: a semaphore.
type permits struct {
	s     *semaphore.Semaphore
	units int
}

type permitHold struct{ *semaphore.Permit }

func (s permits) acquire(ctx context.Context) (hold, error) {
	p, err := s.s.AcquireN(ctx, s.units)
	if err != nil {
		return nil, err
	}
	return permitHold{p}, nil
}

func (s permits) try(ctx context.Context) (hold, error) {
	p, err := s.s.TryAcquireN(ctx, s.units)
	if err != nil {
		return nil, busy(err)
	}
	return permitHold{p}, nil
}

func (h permitHold) release(ctx context.Context) error { return h.Release(ctx) }

// candidate is `etcdsync elect`: a candidate in an election, with its value.
type candidate struct {
	e     *election.Election
	value string
}

type leaderHold struct{ *election.Election }

func (c candidate) acquire(ctx context.Context) (hold, error) {
	if err := c.e.Campaign(ctx, c.value); err != nil {
		return nil, err
	}
	return leaderHold{c.e}, nil
}

// try is refused before any I/O (see parseHold): an election has no try.
func (c candidate) try(context.Context) (hold, error) {
	return nil, errors.New("an election has no try")
}

// release resigns, or, when the leadership was asked to move (Asked), does that (Yield).
// A handover that failed leaving the leadership this one's is errLeadsOn.
func (h leaderHold) release(ctx context.Context) error {
	select {
	case <-h.Asked():
		err := h.Yield(ctx)
		if errors.Is(err, election.ErrNoCandidate) && h.Err() == nil {
			return fmt.Errorf("%w: %w", errLeadsOn, err)
		}
		return err
	default:
		return h.Resign(ctx)
	}
}

// errLeadsOn is the release of a leadership whose handover failed after its command was
// stopped for it (the candidate gave its answer up, or died): it is still this one's, and
// it leads on, running the command again.
var errLeadsOn = errors.New("the handover failed")

// asker is a hold that may be asked to let go: an election's leadership (transfer, a more
// preferred candidate), every other hold by etcdsync ask.
type asker interface{ Asked() <-chan struct{} }

// askedOf is the channel closed once h is asked to let go and the command heeds it: an
// election always, another hold with --yield-on-ask; nil (never) otherwise.
func (c *holdCommand) askedOf(h hold) <-chan struct{} {
	if a, ok := h.(asker); ok && (c.verb == "elect" || c.yieldOnAsk) {
		return a.Asked()
	}
	return nil
}
