package core

import (
	"context"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hold that changes what it is in place keeps its key, so its place in line and its
// token: a Put keeps a key's create revision. What it is then lives in the key's value, as
// its mode: a last field " mode=<m>" (ModeOf). A key without one is in the mode its kind
// says (a write key without a mode is a writer, as etcd's recipe.RWMutex writes it), so a
// foreign client, which reads only the kind, sees something at least as strong as the truth.
//
// Who passes which mode is the waiter's Spec.Passes: a waiter that passes none (a writer)
// counts every key ahead, whatever its value. One that passes some reads the keys ahead with
// their values, and hears a change of mode on the name's watch as a put of a key that was
// there (an arrivals hub delivers those, with the previous value): the weight ahead of it
// falls when a key ahead comes to pass (a write hold that became a read), and rises when
// one stops passing (an upgradable read that became a write). A waiter already served is
// not affected: what it holds beside is for the changing hold to wait out (AwaitGone).

// The modes of a key whose hold changed in place.
const (
	// ModeRead: a write key whose hold is now a read hold (rwmutex Downgrade).
	ModeRead = "read"
	// ModeUpgradable: a write key of an upgradable read: beside readers, never beside a
	// writer or another upgradable read (rwmutex ULock).
	ModeUpgradable = "upgradable"
)

// modeField starts the mode's field in a value.
const modeField = " mode="

// ModeOf is the mode a key's value says: its last field's, if that is " mode=<m>"; else "".
func ModeOf(value string) string {
	i := strings.LastIndex(value, modeField)
	if i < 0 {
		if strings.HasPrefix(value, modeField[1:]) {
			return value[len(modeField)-1:]
		}
		return ""
	}
	m := value[i+len(modeField):]
	if strings.ContainsAny(m, " \t\n") {
		return ""
	}
	return m
}

// WithMode is value with mode as its last field ("" writes none: the kind's own).
func WithMode(value, mode string) string {
	if mode == "" {
		return value
	}
	return value + modeField + mode
}

// ChangeMode puts value into h's key, fenced on its create revision, unless it holds value
// already (a try whose answer was lost applied it), and reads every key of the name with
// its value in the same Txn. It returns those keys and the revision at which the key took
// value: the change's, or the earlier try's. ErrLost, with nothing written, once the key is
// not h's any more. One Txn, retried through leader changes until ctx ends.
func (q *Queue) ChangeMode(ctx context.Context, h *Hold, value string) (kvs []*mvccpb.KeyValue, at int64, err error) {
	cmpOwn := clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(cmpOwn, clientv3.Compare(clientv3.Value(h.key), "!=", value)).
			Then(clientv3.OpPut(h.key, value, clientv3.WithLease(h.sess.Lease())), clientv3.OpGet(q.prefix, clientv3.WithPrefix())).
			Else(clientv3.OpGet(q.prefix, clientv3.WithPrefix())).
			Commit()
	})
	if err != nil {
		return nil, 0, fmt.Errorf("change %s: %w", h.key, err)
	}
	var read []*mvccpb.KeyValue
	if resp.Succeeded {
		read = resp.Responses[1].GetResponseRange().Kvs
	} else {
		read = resp.Responses[0].GetResponseRange().Kvs
	}
	for _, kv := range read {
		if string(kv.Key) == h.key && kv.CreateRevision == h.rev && string(kv.Value) == value {
			return read, kv.ModRevision, nil
		}
	}
	loss := fmt.Errorf("%w: %s", ErrLost, errKeyGone(h.key))
	h.observe(loss)
	return nil, 0, loss
}

// AwaitGone waits until every key of kvs (a read at revision rev of q's name) has been
// deleted since, and returns nil; ErrLost once h's key goes or its session ends first, or
// ctx's error. It is a registration with the client's watch on the name (the queue must
// watch arrivals), like a waiter's: a read only after a gap in the events.
func (q *Queue) AwaitGone(ctx context.Context, h *Hold, kvs []*mvccpb.KeyValue, rev int64) error {
	w := &goneWaiter{view: view{snap: rev, wake: make(chan struct{}, 1)}, key: h.key, rev: h.rev, left: map[string]int64{}}
	for _, kv := range kvs {
		w.left[string(kv.Key)] = kv.CreateRevision
	}
	if len(w.left) == 0 {
		return nil
	}
	hb := join(q.hubKey(), w)
	defer hb.leave(w)
	for {
		hb.mu.Lock()
		done, err := len(w.left) == 0, w.err
		hb.mu.Unlock()
		switch {
		case err != nil:
			return err
		case done:
			return nil
		}
		select {
		case <-w.wake:
		case <-h.sess.Done():
			return h.sess.lostErr()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// goneWaiter is an AwaitGone as its hub sees it: the keys still there, by name. A key's
// delete after the read takes it off, whatever its create revision: the key read was gone
// by then. Its view's err says the holder's own key went.
type goneWaiter struct {
	view
	key  string           // the holder's key
	rev  int64            // and its create revision
	left map[string]int64 // by key, its create revision
}

func (w *goneWaiter) apply(_ int64, evs []event) {
	if w.err != nil {
		return
	}
	for _, e := range evs {
		switch {
		case e.put:
		case e.key == w.key:
			w.fail(fmt.Errorf("%w: %s", ErrLost, errKeyGone(w.key)))
			return
		default:
			delete(w.left, e.key)
		}
	}
	if len(w.left) == 0 {
		signal(w.wake)
	}
}

func (w *goneWaiter) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if !w.reread(rev) {
		return
	}
	present := map[string]int64{}
	for _, kv := range kvs {
		present[string(kv.Key)] = kv.CreateRevision
	}
	if present[w.key] != w.rev {
		w.fail(fmt.Errorf("%w: %s", ErrLost, errKeyGone(w.key)))
		return
	}
	for k := range w.left { // gone, or gone and back: the one read is gone
		if present[k] != w.left[k] {
			delete(w.left, k)
		}
	}
	if len(w.left) == 0 {
		signal(w.wake)
	}
}
