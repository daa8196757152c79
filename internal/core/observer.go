package core

import (
	"context"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Head is the oldest live key of a name: an election's leader. The zero Head says the name
// has no key.
type Head struct {
	Key   string
	Value string
	Token int64 // the key's create revision
}

// pendingLimit bounds the heads an observer keeps for a reader that lags: past it the
// oldest are dropped, so the reader skips some but still gets the latest, in order.
const pendingLimit = 128

// An Observer follows the head of a name: it queues every change of the oldest live key
// or of its value, in revision order, for Next. It is a registration with the client's
// watch on the name in a mode that delivers every put with its value (one watch per
// client and name for all its observers, apart from its waiters' watch); the watch's hub
// reads the name once when the observer joins and again whenever the events cannot say
// what happened (a compaction took them), and the observer sends no RPC of its own.
//
// The view is exact at each revision it reflects: one linearizable read (at revision R)
// and then the events after R, in order and once each. Events at or below R, which a
// member that applies behind can replay, and events a resumed watch repeats are dropped.
type Observer struct {
	h    *hub
	w    *waiter
	once sync.Once
}

// WatchHead starts an observer of the name's head. Stop it when done.
func (q *Queue) WatchHead() *Observer {
	w := &waiter{prefix: q.prefix, slots: 1, wake: make(chan struct{}, 1), stale: true, obs: &headState{live: map[string]liveKey{}}}
	return &Observer{h: join(hubKey{cli: q.cli, prefix: q.prefix, values: true}, w), w: w}
}

// Next returns the next head: the first call the head at the observer's first read, later
// calls each change after the last one returned (never the same head twice in a row). It
// blocks until there is one or ctx ends (ctx.Err()); another error (the client closed, a
// read of the name refused) ends the observer.
func (o *Observer) Next(ctx context.Context) (Head, error) {
	for {
		o.h.mu.Lock()
		s := o.w.obs
		if len(s.pending) > 0 {
			hd := s.pending[0]
			s.pending = s.pending[1:]
			s.taken, s.took = hd, true
			o.h.mu.Unlock()
			return hd, nil
		}
		err := o.w.err
		o.h.mu.Unlock()
		if err != nil {
			return Head{}, err
		}
		select {
		case <-o.w.wake:
		case <-ctx.Done():
			return Head{}, ctx.Err()
		}
	}
}

// Stop ends the registration; only the first call counts. The last registration to leave
// a hub stops its goroutine before Stop returns.
func (o *Observer) Stop() { o.once.Do(func() { o.h.leave(o.w) }) }

type liveKey struct {
	created int64
	value   string
}

// headState is an observer's view of the name, guarded by its hub's mutex: every live key,
// and the heads not yet taken by Next.
type headState struct {
	live    map[string]liveKey
	last    Head // the head queued last
	queued  bool // a head was queued: last is set
	pending []Head
	taken   Head // the head Next returned last
	took    bool
}

func (s *headState) put(key string, created int64, value string) {
	s.live[key] = liveKey{created: created, value: value}
}

func (s *headState) remove(key string) { delete(s.live, key) }

func (s *headState) reset(kvs []*mvccpb.KeyValue) {
	clear(s.live)
	for _, kv := range kvs {
		s.put(string(kv.Key), kv.CreateRevision, string(kv.Value))
	}
}

// head is the live key created first. Linear in the keys, which are the candidates.
func (s *headState) head() Head {
	var hd Head
	for k, v := range s.live {
		if hd.Token == 0 || v.created < hd.Token {
			hd = Head{Key: k, Value: v.value, Token: v.created}
		}
	}
	return hd
}

// update queues the head if it changed, and reports whether it did.
func (s *headState) update() bool {
	hd := s.head()
	if s.queued && hd == s.last {
		return false
	}
	s.last, s.queued = hd, true
	s.pending = append(s.pending, hd)
	for len(s.pending) > pendingLimit || len(s.pending) > 0 && s.took && s.pending[0] == s.taken {
		s.pending = s.pending[1:] // dropping the oldest must not make the reader see one twice
	}
	return true
}

// Head reads the name's head, linearizably: the zero Head when the name has no key. One
// Range, retried through leader changes until ctx ends.
func (q *Queue) Head(ctx context.Context) (Head, error) {
	var b backoff
	for {
		resp, err := q.cli.Get(clientv3.WithRequireLeader(ctx), q.prefix, clientv3.WithFirstCreate()...)
		if err == nil {
			if len(resp.Kvs) == 0 {
				return Head{}, nil
			}
			kv := resp.Kvs[0]
			return Head{Key: string(kv.Key), Value: string(kv.Value), Token: kv.CreateRevision}, nil
		}
		if !transient(err) || ctx.Err() != nil {
			return Head{}, fmt.Errorf("read the first key of %s: %w", q.prefix, err)
		}
		if err := b.wait(ctx); err != nil {
			return Head{}, err
		}
	}
}
