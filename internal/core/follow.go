package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// What a barrier or a latch waits for is a state of a few keys (a round filled, a count at
// zero, a participant gone), not the order of a line. So a wait places a watch of those keys
// from the present, then reads the state, and from then on takes the events after its read
// (those at or before it are in the read already); after any gap in the watch (history
// compacted, a watch cancelled or refused by an auth change, a member without a leader, a
// broken stream) it places a new watch and reads again instead of trusting what it missed.
// A wait that begins after the state it waits for was reached returns after its read,
// whatever the revision is by then. The watch is placed before the read, not from the
// revision after it: a watch from a past revision is served only by etcd's resync loop,
// every 100 ms, which would delay every wait on a name being written to.
//
// A watch that the client resumes after a member restarted goes on from the revision after
// the last it delivered; if the cluster went back in time (a restore), that revision is
// ahead of the cluster's, and the watch waits silently for it, past every change in
// between. So a wait also reads the cluster's revision every probeEvery (one read per
// client for all its waits, see clock.confirmEvery), as a hub of observers does.

// ReadState reads ops in one Txn, a linearizable snapshot, retried through leader changes.
// If the cluster went back in time (see client.go), it rewinds the client and returns
// ErrLost wrapping why.
func ReadState(ctx context.Context, cli *clientv3.Client, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	var sent int64
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		sent = clockOf(cli).now()
		return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
	})
	if err != nil {
		return nil, WaitErr(ctx, cli, err)
	}
	if err := settleLinear(cli, resp.Header, sent); err != nil {
		return nil, err
	}
	return resp, nil
}

// WaitErr is the error of a wait whose request failed with err: ctx's own error when ctx
// ended, ErrLost when the client was closed under it, else err.
func WaitErr(ctx context.Context, cli *clientv3.Client, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case cli.Ctx().Err() != nil:
		return fmt.Errorf("%w: %w", ErrLost, errClientClosed)
	}
	return err
}

// A Verdict is what a wait makes of the state it read, or of an event.
type Verdict int

const (
	StillWaiting Verdict = iota // not yet: go on watching
	WaitOver                    // the wait is over
	ReadAgain                   // the event says too little: read the state again
)

// Follow is a wait on key (a prefix too, with clientv3.WithPrefix in opts), as above: check
// reads the state and returns the revision it read at and its verdict (StillWaiting or
// WaitOver); each judges an event after that revision (ReadAgain calls check again, on the
// same watch). It returns true once a verdict is WaitOver, false when stop closed first (the caller reads
// what stopped it); ctx's error when ctx ends; ErrLost when the client is closed or the
// cluster went back in time; the error of check or each.
func Follow(ctx context.Context, cli *clientv3.Client, key string, stop <-chan struct{},
	check func() (rev int64, v Verdict, err error),
	each func(*clientv3.Event) (Verdict, error), opts ...clientv3.OpOption) (bool, error) {
	return followAll(ctx, cli, []watched{{key, opts}}, stop, check, each)
}

// watched is a key (or a range, by its opts) that a wait follows.
type watched struct {
	key  string
	opts []clientv3.OpOption
}

// followAll is follow over several keys or ranges at once: every watch is placed before the
// read, and an event of any of them is judged.
func followAll(ctx context.Context, cli *clientv3.Client, ws []watched, stop <-chan struct{},
	check func() (rev int64, v Verdict, err error),
	each func(*clientv3.Event) (Verdict, error)) (bool, error) {
	return followAllKept(ctx, cli, ws, stop, check, each, false)
}

// followAllKept is followAll; with keep, the watches of a wait that is over stay on the
// client's stream until ctx ends (see awaitDeletes), instead of ending with the call.
func followAllKept(ctx context.Context, cli *clientv3.Client, ws []watched, stop <-chan struct{},
	check func() (rev int64, v Verdict, err error),
	each func(*clientv3.Event) (Verdict, error), keep bool) (bool, error) {
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	var b Backoff
	for {
		ok, gap, err := followOnce(ctx, cli, ws, stop, probe.C, check, each, keep)
		if !gap || err != nil {
			return ok, err
		}
		// A watch refused at once (an auth change in flight, no leader) is placed again
		// after a pause, not in a loop.
		if err := b.wait(ctx); err != nil {
			return false, err
		}
	}
}

// followOnce is one watch of each of ws: gap says that it ended with neither a verdict nor
// an error, and new watches are due.
func followOnce(ctx context.Context, cli *clientv3.Client, ws []watched, stop <-chan struct{}, probe <-chan time.Time,
	check func() (int64, Verdict, error), each func(*clientv3.Event) (Verdict, error), keep bool) (ok, gap bool, err error) {
	var forwarders sync.WaitGroup
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer func() {
		if ok && keep {
			context.AfterFunc(ctx, cancel) // the watches and their forwarders end with ctx
			return
		}
		cancel()
		forwarders.Wait()
	}()
	type answer struct {
		resp clientv3.WatchResponse
		open bool
	}
	// The watches' responses, in one channel: each watch's in its order, which is all the
	// discipline needs (an event at or before the read is skipped, whichever watch it
	// came from).
	answers := make(chan answer)
	for _, w := range ws {
		ch := cli.Watch(wctx, w.key, append([]clientv3.OpOption{clientv3.WithCreatedNotify()}, w.opts...)...)
		forwarders.Add(1)
		go func() {
			defer forwarders.Done()
			for resp := range ch {
				select {
				case answers <- answer{resp, true}:
				case <-wctx.Done():
					return
				}
			}
			select {
			case answers <- answer{open: false}:
			case <-wctx.Done():
			}
		}()
	}
	unplaced := len(ws)
	var read int64 = -1 // the revision of the last check; -1 before every watch is placed
	for {
		select {
		case <-probe:
			if rw := clockOf(cli).confirmEvery(ctx, cli, probeEvery); rw != nil {
				rewind(cli, rw)
				return false, false, fmt.Errorf("%w: %w", ErrLost, rw)
			}
		case a := <-answers:
			resp := a.resp
			if !a.open || resp.Canceled || resp.Err() != nil {
				return false, true, WaitErr(ctx, cli, nil)
			}
			if resp.Created {
				unplaced--
			}
			if read < 0 && unplaced > 0 {
				continue // a watch's event before every watch is placed: the read sees it
			}
			if read < 0 { // placed: their events are those after their creation, and the read follows
				rev, v, err := check()
				if v == WaitOver || err != nil {
					return v == WaitOver, false, err
				}
				read = rev
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision <= read {
					continue // the read saw it
				}
				v, err := each(ev)
				if v == ReadAgain && err == nil {
					read, v, err = check()
				}
				if v == WaitOver || err != nil {
					return v == WaitOver, false, err
				}
			}
		case <-stop:
			return false, false, nil
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
	}
}

// AwaitGone is the one wait for a key to go: it returns true once the key of kv is gone
// (deleted, or created again since: its create revision is another), or, with changed, also
// once it was written again (its mod revision is another); false, with nil, when stop closed
// first. Follow's watch-then-read: a gap in the watch is followed by a read, never trusted.
// Errors: ctx's when ctx ends; ErrLost when the client is closed or the cluster went back in
// time. Cost: a watch of the key and one Range, again after each gap.
func AwaitGone(ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, stop <-chan struct{}, changed bool) (bool, error) {
	return awaitGoneKept(ctx, cli, kv, stop, changed, false)
}

// awaitGoneKept is awaitGone; with keep, its watch stays until ctx ends once the key is
// gone (see followAllKept).
func awaitGoneKept(ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, stop <-chan struct{}, changed, keep bool) (bool, error) {
	key := string(kv.Key)
	var opts []clientv3.OpOption
	if !changed {
		opts = append(opts, clientv3.WithFilterPut())
	}
	check := func() (int64, Verdict, error) {
		get := []clientv3.OpOption{clientv3.WithKeysOnly()}
		resp, err := ReadState(ctx, cli, clientv3.OpGet(key, get...))
		if err != nil {
			return 0, StillWaiting, err
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != kv.CreateRevision || changed && kvs[0].ModRevision != kv.ModRevision {
			return resp.Header.Revision, WaitOver, nil
		}
		return resp.Header.Revision, StillWaiting, nil
	}
	each := func(*clientv3.Event) (Verdict, error) { return WaitOver, nil } // a delete, or with changed a put
	return followAllKept(ctx, cli, []watched{{key, opts}}, stop, check, each, keep)
}

// A waiter far back in line does not hear every release. A client's hub of a name hears
// every delete under it, which is what lets a waiter near the head be served the moment its
// last predecessor goes, with no read; but a release heard by every waiting client costs
// etcd an event per client, so a fleet of N clients queued on one name would cost O(N) per
// hand-off. So a waiter far back (nearAhead keys and its threshold's worth more ahead), on
// a client with no hub of the name yet, first approaches: it reads the keys just ahead of
// its own, passes over the nearAhead nearest, and watches the next ones, the fewest that
// together weigh its threshold (Spec.slots: one key for an exclusive waiter, capacity less
// weight plus one units for a semaphore's). While they weigh that much it cannot be served,
// whatever else is ahead; once enough of them are gone (released, or withdrawn) it joins the
// hub, which reads the name then and counts from there. The nearAhead keys passed over are
// the margin: the hub's watch and read are in place while they still hand off, off the path
// of the release that serves the waiter.
//
// So a release is heard by the clients of the waiters near the head, by the few
// approaching waiters that watch its key, and by the few clients that just had their turn
// (a hub whose last waiter approached lingers through one release of another client; see
// hubLinger): a bound that does not grow with the fleet. A waiter whose threshold is above
// maxApproachKeys (a semaphore of a large capacity) joins the hub at once, which bounds the
// watches one waiter places; the bound is a judgment (capacity 4 is what was measured). A
// waiter of a client that has a hub of the name already (a loop of Lock and Unlock) joins it
// at once, as that costs etcd nothing more, and so does one whose client has many waiters
// in the line (a worker pool: see pooled).
// nearAhead is small, as a near waiter hears every release until its turn (performance.md:
// 2 against 4, measured), and not 1, so that the hub's watch and read precede its turn.
//
// A waiter that passes some modes (Spec.Passes: a reader) reads the keys ahead with their
// values, picks among those that count (reading further back when keys that pass took
// room), and ends its approach when a key it watches is written as well as deleted: its
// hold may have changed to a mode that passes.
//
// A semaphore's waiter that approaches watches its limit's marker too (see records.go): a
// change of the limit ends the approach, and the hub, reading the name, counts under the
// new limit.
//
// A waiter's own key is not watched while it approaches: its delete (an operator's, or a
// lease's end the session has not yet noticed) is seen by the next read, when the keys it
// watches go, and only then does its Lock end (with ErrReleasedByOperator for an
// operator's release). Its session's end is seen at once. An election's candidate is the
// exception (Spec.Handover): a handover to it deletes its key, which it must hear of at
// once, so it watches its own key too.

// maxApproachKeys is the largest threshold for which a waiter approaches: the most keys
// it watches at once.
const maxApproachKeys = 8

// poolShare: a client whose waiters in a name's line are two or more and 1/poolShare of the
// keys ahead of its newest, or more, waits on its hub: a release is one event for all of
// them, where each waiter that approached would cost etcd a read of the keys ahead (a scan
// of the name, whatever its limit), a watch created and cancelled, and the hub's read. A
// fleet of small pools (a few waiters per client in a long line) approaches as a fleet does.
const poolShare = 16

// inLine counts an acquisition of k's name among its client's waiters in that line, from
// its write (so that waiters queued together count one another) until it is served or
// ends, and returns the call that uncounts it.
func inLine(k hubKey) (out func()) {
	st := stateOf(k.cli)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.waiting[k]++
	return func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.waiting[k]--; st.waiting[k] == 0 {
			delete(st.waiting, k)
		}
	}
}

// pooled reports whether the client has a hub of k's name, or waiters in its line (counted
// by inLine) numerous enough beside ahead keys that it waits on one (see poolShare).
func pooled(k hubKey, ahead int) bool {
	st := stateOf(k.cli)
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.hubs[k]
	return ok || st.waiting[k] >= 2 && st.waiting[k]*poolShare > ahead
}

// far reports whether the waiter of q, ahead of which keys weighing ahead are, approaches
// first (see above). The waiter is counted by inLine already.
func (a *acquisition) far(q *Queue, ahead int) bool {
	n := a.spec.slots()
	return n <= maxApproachKeys && ahead >= int(nearAhead.Load())+n && !pooled(q.hubKey(), ahead)
}

// approach waits until the keys of the queue's Ahead range that are ahead of the key
// created at rev may weigh less than the threshold plus nearAhead, and returns what it knows
// then, as of revision snap: the weight ahead; or, once the keys it watched went, -1: the
// hub reads what is ahead. One Range (the keys just ahead, with no value) and a watch of
// each of the few keys it picks, on the client's watch stream; each again only when a watch
// could not be kept. ErrLost when the session ends first, or its own key is found gone.
func (a *acquisition) approach(ctx context.Context, q *Queue, key string, rev int64) (snap int64, ahead int, linger func(), err error) {
	cli, aheadRange := q.cli, q.prefix+a.spec.Ahead
	near, need, w := int(nearAhead.Load()), a.spec.slots(), weigherOf(q, a.spec)
	mark := ""
	if a.spec.CapacityMark != "" {
		mark = q.prefix + a.spec.CapacityMark
	}
	var b Backoff
	for limit := near + need; ; {
		// Its own key is read too: the read's revision is the waiter's new snapshot, and a
		// delete of the key before it would be no news to the hub's events. Every key that
		// counts weighs at least one unit, so near+need of them hold the margin and the
		// watched; with Passes, keys that pass may take room in the read: it reads more.
		var sent int64
		reads := []clientv3.Op{
			clientv3.OpGet(key, clientv3.WithKeysOnly()),
			clientv3.OpGet(aheadRange, append(w.keys(), clientv3.WithMaxCreateRev(rev-1),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))...),
		}
		if mark != "" {
			reads = append(reads, clientv3.OpGet(mark, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
		}
		resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			sent = clockOf(cli).now()
			return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(reads...).Commit()
		})
		if err == nil {
			err = settleLinear(cli, resp.Header, sent)
		}
		switch {
		case err != nil && cli.Ctx().Err() != nil:
			return 0, 0, nil, fmt.Errorf("%w: %w", ErrLost, errClientClosed)
		case err != nil:
			return 0, 0, nil, fmt.Errorf("read the keys ahead of %s: %w", a.describe(), err)
		}
		own := resp.Responses[0].GetResponseRange().Kvs
		if len(own) == 0 || own[0].CreateRevision != rev {
			return 0, 0, nil, fmt.Errorf("%w: key %s %w", ErrLost, key, errDeletedWhileWaiting)
		}
		kvs, at := resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision
		var extras []*mvccpb.KeyValue // watched with the keys: the delete of one ends the approach
		if a.spec.Handover {
			extras = append(extras, own[0]) // a handover to it deletes it (see handover.go)
		}
		if markers := resp.Responses[len(reads)-1].GetResponseRange().Kvs; mark != "" && len(markers) > 0 {
			// None: a record of an older version, marked only before its first change; the
			// waiter then learns of a change once it joins the hub, which reads the name.
			if c, _ := markedIn(markers, mark); c != a.spec.capacity() || len(markers) != 1 {
				return at, -1, nil, nil // the capacity changed since the waiter queued: the hub reads it
			}
			extras = append(extras, markers[0]) // the capacity's change ends the approach
		}
		counting := slices.DeleteFunc(slices.Clone(kvs), func(kv *mvccpb.KeyValue) bool { return w.kv(kv, rev) == 0 })
		more := resp.Responses[1].GetResponseRange().More
		switch {
		case len(counting) < near+need && more:
			limit *= 2 // keys that pass took room: read further back
			continue
		case len(counting) < near+need: // every key ahead
			weight := 0
			for _, kv := range counting {
				weight += w.kv(kv, rev)
			}
			return at, weight, nil, nil
		}
		watched, weight := counting[near:], 0
		for i, kv := range watched {
			if weight += w.kv(kv, rev); weight >= need {
				watched = watched[:i+1]
				break
			}
		}
		gone, linger, err := a.awaitDeletes(ctx, watched, need, w, extras)
		switch {
		case err != nil:
			return 0, 0, nil, err
		case gone:
			return at, -1, linger, nil
		}
		if err := b.wait(ctx); err != nil { // a watch broke (compaction, a refusal): read again
			return 0, 0, nil, err
		}
	}
}

// awaitDeletes waits (awaitGone, each key on its own) until those of kvs left weigh less than
// need or one of extras is deleted (true; with w's passes, a key of kvs written again counts
// as gone: its mode may pass now, and the hub reads what it is), a wait ends without saying
// so (false: the client closed, or the cluster went back in time), the session ends (its
// loss) or ctx ends. The watches share the client's stream with its hubs' watches.
//
// When it returns true the watches stay until linger is called: the waiter calls it once
// its hub's watch is on the client's stream. A stream whose last watch ends closes, so the
// approach's watches ending first would have the hub open a stream of its own, an RPC and a
// stream in etcd for every hand-off of a fleet.
func (a *acquisition) awaitDeletes(ctx context.Context, kvs []*mvccpb.KeyValue, need int, w weigher, extras []*mvccpb.KeyValue) (gone bool, linger func(), err error) {
	cli := a.cli()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(cli.Ctx()))
	stopCtx := context.AfterFunc(ctx, cancel)
	stopSess := context.AfterFunc(a.sess.ctx, cancel)
	var wg sync.WaitGroup
	end := func() {
		stopCtx()
		stopSess()
		cancel()
		wg.Wait()
	}
	watched := append(kvs[:len(kvs):len(kvs)], extras...)
	goneAt := make(chan int, len(watched)) // the index of a key deleted, or -1: a watch ended
	left := 0
	for i, kv := range watched {
		if i < len(kvs) {
			left += w.of(string(kv.Key))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if went, _ := awaitGoneKept(wctx, cli, kv, nil, i < len(kvs) && len(w.passes) > 0, true); went {
				goneAt <- i
			} else {
				goneAt <- -1
			}
		}()
	}
	for left >= need {
		select {
		case i := <-goneAt:
			switch {
			case i < 0:
				end()
				return false, nil, a.watchEnded(ctx)
			case i >= len(kvs):
				return true, end, nil // an extra: the hub reads what changed
			}
			left -= w.of(string(kvs[i].Key))
		case <-wctx.Done():
			end()
			return false, nil, a.watchEnded(ctx)
		}
	}
	return true, end, nil
}

// watchEnded is why a watch of awaitDeletes ended without a delete: the session's loss,
// ctx's end, or nil (read again).
func (a *acquisition) watchEnded(ctx context.Context) error {
	switch {
	case a.sess.ctx.Err() != nil:
		return a.sess.lostErr()
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return nil
}
