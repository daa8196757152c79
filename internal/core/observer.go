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
// and then the events after R, in order, once each and a whole revision at a time, so that
// a head that went at the same revision as its successor is never reported.
type Observer struct {
	h    *hub
	o    *observer
	once sync.Once
}

// WatchHead starts an observer of the name's head. Stop it when done.
func (q *Queue) WatchHead() *Observer {
	o := &observer{wake: make(chan struct{}, 1), rereading: true, live: map[string]liveKey{}}
	return &Observer{h: join(hubKey{cli: q.cli, prefix: q.prefix, mode: values}, o), o: o}
}

// Next returns the next head: the first call the head at the observer's first read, later
// calls each change after the last one returned (never the same head twice in a row). It
// blocks until there is one or ctx ends (ctx.Err()); another error (the client closed, a
// read of the name refused) ends the observer.
func (o *Observer) Next(ctx context.Context) (Head, error) {
	for {
		o.h.mu.Lock()
		s := o.o
		if len(s.pending) > 0 {
			hd := s.pending[0]
			s.pending = s.pending[1:]
			s.taken, s.took = hd, true
			o.h.mu.Unlock()
			return hd, nil
		}
		err := s.err
		o.h.mu.Unlock()
		if err != nil {
			return Head{}, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Head{}, ctx.Err()
		}
	}
}

// Stop ends the registration; only the first call counts.
func (o *Observer) Stop() { o.once.Do(func() { o.h.leave(o.o) }) }

type liveKey struct {
	created int64
	value   string
}

// observer is an Observer as its hub sees it: every live key of the name, and the heads not
// yet taken by Next. Its fields are guarded by the hub's mutex.
type observer struct {
	wake      chan struct{}
	snap      int64 // the revision of its last read: events at or below it are in the view
	applied   int64 // the revision of the last event applied: a read older than it is stale
	rereading bool
	err       error

	live    map[string]liveKey
	last    Head // the head queued last
	queued  bool // a head was queued: last is set
	pending []Head
	taken   Head // the head Next returned last
	took    bool
}

func (o *observer) since() int64 { return o.snap }

func (o *observer) stale() bool { return o.rereading && o.err == nil }

// apply takes one revision's puts and deletes, then looks at the head once: what the
// revision changed together is one change.
func (o *observer) apply(rev int64, evs []event) {
	if o.rereading || o.err != nil {
		return
	}
	for _, e := range evs {
		if e.put {
			o.live[e.key] = liveKey{created: e.created, value: e.value}
		} else {
			delete(o.live, e.key)
		}
	}
	o.applied = rev
	o.update()
}

func (o *observer) missed() { o.rereading = true }

func (o *observer) fail(err error) {
	if o.err == nil {
		o.err = err
		signal(o.wake)
	}
}

func (o *observer) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !o.stale() || rev < o.applied {
		return
	}
	clear(o.live)
	for _, kv := range kvs {
		o.live[string(kv.Key)] = liveKey{created: kv.CreateRevision, value: string(kv.Value)}
	}
	o.snap, o.applied, o.rereading = rev, rev, false
	o.update()
}

// head is the live key created first. Linear in the keys, which are the candidates.
func (o *observer) head() Head {
	var hd Head
	for k, v := range o.live {
		if hd.Token == 0 || v.created < hd.Token {
			hd = Head{Key: k, Value: v.value, Token: v.created}
		}
	}
	return hd
}

// update queues the head if it changed.
func (o *observer) update() {
	hd := o.head()
	if o.queued && hd == o.last {
		return
	}
	o.last, o.queued = hd, true
	o.pending = append(o.pending, hd)
	for len(o.pending) > pendingLimit || len(o.pending) > 0 && o.took && o.pending[0] == o.taken {
		o.pending = o.pending[1:] // dropping the oldest must not make the reader see one twice
	}
	signal(o.wake)
}

// Head reads the name's head, linearizably: the zero Head when the name has no key. One
// Range, retried through leader changes until ctx ends.
func (q *Queue) Head(ctx context.Context) (Head, error) {
	resp, err := retry(ctx, func() (*clientv3.GetResponse, error) {
		return q.cli.Get(clientv3.WithRequireLeader(ctx), q.prefix, clientv3.WithFirstCreate()...)
	})
	if err != nil {
		return Head{}, fmt.Errorf("read the first key of %s: %w", q.prefix, err)
	}
	if len(resp.Kvs) == 0 {
		return Head{}, nil
	}
	kv := resp.Kvs[0]
	return Head{Key: string(kv.Key), Value: string(kv.Value), Token: kv.CreateRevision}, nil
}
