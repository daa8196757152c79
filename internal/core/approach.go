package core

import (
	"context"
	"fmt"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A waiter far back in line does not hear every release. A client's hub of a name hears
// every delete under it, which is what lets a waiter near the head be served the moment its
// last predecessor goes, with no read; but a release heard by every waiting client costs
// etcd an event per client, so a fleet of N clients queued on one name would cost O(N) per
// hand-off. So an exclusive waiter (one that any key ahead keeps waiting) with more than
// nearAhead keys ahead, on a client with no hub of the name yet, first approaches: it reads
// the keys just ahead of its own, watches one of them, the (nearAhead+1)-th nearest, and
// only once that key is gone (released at the head, or withdrawn) joins the hub, which
// reads the name then and counts from there. While that key lives more than nearAhead keys
// are ahead, so the waiter cannot be served; once it is gone at most nearAhead may be, and
// the hub's watch and read are in place while those still hand off, off the path of the
// release that serves the waiter.
//
// So a release is heard by the clients of the nearAhead waiters behind it, by one
// approaching waiter, and by the few clients that just had their turn (a hub whose last
// waiter approached lingers through 2*nearAhead releases; see hubLinger): a bound that does
// not grow with the fleet. A waiter of a client that has a hub of the name already (a loop of Lock and
// Unlock) joins it at once, as that costs etcd nothing more. nearAhead is small because each
// near waiter hears every release until its turn (docs/performance.md has 2 against 4,
// measured), and not 1, so that the hub's watch and read are in place before its turn.
//
// A waiter's own key is not watched while it approaches: its delete (an operator's, or a
// lease's end the session has not yet noticed) is seen by the next read, when the key it
// watches goes. Its session's end is seen at once.

// nearAhead is how many keys may be ahead of a waiter for it to join its client's hub of the
// name at once (see approach); 2 unless a test set it (SetNearAhead).
var nearAhead atomic.Int64

func init() { nearAhead.Store(2) }

// SetNearAhead sets how many keys may be ahead of a waiter for it to join its client's hub
// at once, and returns what restores it. For the fault suites, which set it to 1 so that
// their few clients approach too; not for use beside other tests.
func SetNearAhead(n int) (restore func()) {
	old := nearAhead.Swap(int64(n))
	return func() { nearAhead.Store(old) }
}

// far reports whether the waiter of q, ahead of which ahead keys are, approaches first.
// Waiters that a release may serve with keys still ahead (a semaphore's, of a capacity
// above one) cannot tell from one key's life when they may be served, and join the hub.
func (a *acquisition) far(q *Queue, ahead int) bool {
	return a.spec.slots() == 1 && !a.spec.weighted() && ahead > int(nearAhead.Load()) && !hasHub(q.hubKey())
}

// approach waits until at most nearAhead keys of the queue's Ahead range may be ahead of the
// key created at rev, and returns what it knows then, as of revision snap: ahead keys
// ahead; or, once the key it watched went, -1: the hub reads what is ahead. One Range (the keys just ahead, with no value) and one watch of one key on the
// client's watch stream, each again only when the watch could not be kept; ErrLost when the
// session ends first, or its own key is found gone.
func (a *acquisition) approach(ctx context.Context, q *Queue, key string, rev int64) (snap int64, ahead int, err error) {
	cli, aheadRange, near := q.cli, q.prefix+a.spec.Ahead, int(nearAhead.Load())
	var b backoff
	for {
		// Its own key is read too: the read's revision is the waiter's new snapshot, and a
		// delete of the key before it would be no news to the hub's events.
		var sent int64
		resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
			sent = clockOf(cli).now()
			return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(
				clientv3.OpGet(key, clientv3.WithKeysOnly()),
				clientv3.OpGet(aheadRange, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(rev-1),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(near)+1)),
			).Commit()
		})
		if err == nil {
			err = settleLinear(cli, resp.Header, sent)
		}
		switch {
		case err != nil && cli.Ctx().Err() != nil:
			return 0, 0, fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		case err != nil:
			return 0, 0, fmt.Errorf("read the keys ahead of %s: %w", a.describe(), err)
		}
		if own := resp.Responses[0].GetResponseRange().Kvs; len(own) == 0 || own[0].CreateRevision != rev {
			return 0, 0, fmt.Errorf("%w: key %s deleted while waiting", ErrLost, key)
		}
		kvs, at := resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision
		if len(kvs) <= near {
			return at, len(kvs), nil
		}
		gone, err := a.awaitDelete(ctx, kvs[near], at)
		switch {
		case err != nil:
			return 0, 0, err
		case gone:
			return at, -1, nil
		}
		if err := b.wait(ctx); err != nil { // the watch broke (compaction, a refusal): read again
			return 0, 0, err
		}
	}
}

// awaitDelete watches key, which a read at revision read found, until it is deleted (true),
// the watch ends without saying so (false: compacted, refused, or the client closed), the
// session ends (its loss) or ctx ends. The watch starts from the present, as etcd serves a
// watch from the past only every 100 ms; if the present is past read, one read of the key
// covers the revisions in between. It shares the client's stream with its hubs' watches.
func (a *acquisition) awaitDelete(ctx context.Context, kv *mvccpb.KeyValue, read int64) (bool, error) {
	cli, key := a.cli(), string(kv.Key)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(cli.Ctx()))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	defer context.AfterFunc(a.sess.ctx, cancel)()
	for wr := range cli.Watch(wctx, key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut()) {
		if wr.Err() != nil {
			break
		}
		if wr.Created && wr.Header.Revision > read {
			resp, err := cli.Get(wctx, key, clientv3.WithKeysOnly())
			if err != nil {
				break
			}
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != kv.CreateRevision {
				return true, nil
			}
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return true, nil
			}
		}
	}
	switch {
	case a.sess.ctx.Err() != nil:
		return false, a.sess.lostErr()
	case ctx.Err() != nil:
		return false, ctx.Err()
	}
	return false, nil
}
