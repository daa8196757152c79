package core

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watch starts watching the key, unless it is watched already or the hold has ended: on
// the client's keyWatch, or through the client's own Watcher when it is wrapped (see
// ownWatch).
func (h *Hold) watch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keyed || h.mon != nil || h.state == lost || h.state == over {
		return
	}
	if ownWatch(h.cli) {
		h.keyed = true
		stateOf(h.cli).keys.add(h)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.mon = &monitor{stop: cancel, done: make(chan struct{})}
	go h.monitor(ctx)
}

// unwatch stops the watch of a hold that has ended. Under h.mu.
func (h *Hold) unwatch() {
	switch {
	case h.keyed:
		stateOf(h.cli).keys.remove(h)
	case h.mon != nil:
		h.mon.stop()
	}
}

// A monitor is the goroutine that watches the key of a hold on a client whose KV or
// Watcher is wrapped, through that Watcher: the keyWatch's raw stream would watch keys
// other than those the client wrote.
type monitor struct {
	stop context.CancelFunc
	done chan struct{} // closed when the monitor has returned
}

// waitMonitor waits for the monitor, if one was started, to return. Not under h.mu, which
// the monitor takes; call it once the hold has ended (end stops the monitor).
func (h *Hold) waitMonitor() {
	h.mu.Lock()
	m := h.mon
	h.mu.Unlock()
	if m != nil {
		<-m.done
	}
}

// monitor (for a client with a wrapped Watcher) watches the key from the revision after its creation, so no delete is missed
// whenever the watch starts; it re-watches through leader changes until the hold ends. What
// it sees it reports with observe, which ends a held hold at once and leaves a release under
// way to weigh it; it then returns, as there is nothing left to watch.
//
// The session's end interrupts whatever the monitor waits for, also a Watch call, which
// blocks until etcd answers, and the pause between two watches: a session that ends at its
// local deadline is the news that etcd cannot be reached, and the hold must end then, not
// once etcd answers again. In an outage the monitor spends most of its time in that pause
// (a member without a leader refuses the watch at once), so the pause ending early must
// lead to the loss, never to a quiet return.
//
// The monitor returns only once the hold has ended; should it ever return with the hold
// still held, the deferred observe ends the hold as lost: Done must never stay open with
// nothing left to close it.
func (h *Hold) monitor(stop context.Context) {
	defer close(h.mon.done)
	defer h.observe(errMonitorStopped)
	ctx, cancel := context.WithCancel(stop)
	defer cancel()
	defer context.AfterFunc(h.sess.ctx, cancel)()
	from := h.rev + 1
	var b backoff
	for {
		var next int64
		var loss error
		if ctx.Err() == nil { // no watch is opened on a done ctx: only what ended it counts
			next, loss = h.watchKey(ctx, from)
		}
		if loss == nil {
			loss = h.sess.lostErr()
		}
		if loss == nil && h.cli.Ctx().Err() != nil {
			// The watch of a closed client ends at once, and may be seen to before the
			// client's end is (watchKey's select picks either): the loss is known now.
			loss = fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		}
		if loss != nil {
			h.observe(loss)
			h.settleLoss()
			return
		}
		if stop.Err() != nil || ctx.Err() != nil {
			return // the hold ended (end stopped the monitor); else the deferred observe ends it
		}
		from = next
		_ = b.wait(ctx) // cut short by the session's end, which the next round reports
	}
}

// errMonitorStopped is the loss of a hold whose monitor returned while it was still held,
// which no path of the monitor does: the guard that keeps Done from staying open for good.
var errMonitorStopped = fmt.Errorf("%w: the watch of the hold's key and session stopped", ErrLost)

// watchKey returns when the watch fails (with the revision to watch from next), the key is
// gone or nothing can keep it (the loss), the session ends, or ctx ends.
func (h *Hold) watchKey(ctx context.Context, from int64) (next int64, loss error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := h.cli.Watch(wctx, h.key, clientv3.WithRev(from), clientv3.WithFilterPut())
	for {
		select {
		case wr, ok := <-wch:
			switch {
			case !ok:
				return from, nil
			case errors.Is(wr.Err(), rpctypes.ErrCompacted), wr.Canceled && wr.Err() != nil:
				// Compacted past from, or refused (a token issued before a change to the
				// auth store, a permission revoked): read the key before watching again.
				return h.checkKey(ctx, from)
			case wr.Err() != nil:
				return from, nil
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return from, errKeyGone(h.key)
				}
			}
			from = wr.Header.Revision + 1
		case <-h.sess.Done():
			return from, nil // see monitor
		case <-h.cli.Ctx().Done():
			// Nothing can keep or release the key through a closed client.
			return from, fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		case <-ctx.Done():
			return from, nil
		}
	}
}

// checkKey reads the key after a compaction took the history the watch needed, or etcd
// refused the watch; clientv3 logs in again if that was for an old token. A read that etcd
// refuses for good is a loss: the key cannot be watched.
func (h *Hold) checkKey(ctx context.Context, from int64) (next int64, loss error) {
	resp, err := h.cli.Get(clientv3.WithRequireLeader(ctx), h.key)
	switch {
	case err != nil && (transient(err) || ctx.Err() != nil):
		return from, nil
	case err != nil:
		return from, errUnwatchable(h.key, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.rev {
		return from, errKeyGone(h.key)
	}
	return resp.Header.Revision + 1, nil
}
