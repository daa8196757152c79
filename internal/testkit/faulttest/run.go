package faulttest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	workers       = 4                     // one client each, over every member (see Start)
	writesPerHold = 2                     // accepted writes a hold makes before it releases
	opTimeout     = 2 * time.Second       // of one Get, Txn or Unlock attempt
	pause         = 50 * time.Millisecond // between attempts that failed fast (a member down)
	noiseEvery    = 5 * time.Millisecond  // large background writes, so that followers lag...
	noiseSize     = 128 << 10             // ...applying them behind the leader
	noiseCompact  = 400                   // background writes between compactions, to bound the store
	lockTimeout   = 20 * time.Second      // a Lock that waits longer is abandoned and retried
	holdMargin    = 10 * time.Second      // see holdLimit
	releaseMargin = 3 * time.Second       // see releaseLimit
)

// Run is a workload running on an Env: workers on clients spread over the members take
// holds on one name, make fenced writes under them and release them, and reader workers,
// if the workload has readers, take read holds beside them, recording a History, while a
// background writer keeps the revision moving, so that followers lag behind the leader as
// they do under load.
type Run struct {
	env     *Env
	w       Workload
	name    string
	data    string // prefix of the register and its markers, outside the lock's prefix
	counter string
	hist    *History
	workers []*worker
	readers []*reader // none without Workload.OpenReader

	stop      chan struct{} // closed by Stop: workers finish their cycle and return
	stopLocks context.CancelFunc
	wg        sync.WaitGroup
	writeIDs  atomic.Int64
	scoped    atomic.Int64                         // holds taken through Do or Run (the explorer's)
	changed   atomic.Int64                         // downgrades and upgrades made (the explorer's)
	strike    atomic.Pointer[func(*worker, int64)] // called once, before the next fenced Txn

	untoldMu sync.Mutex
	untold   []string // holds whose fenced write was refused and whose Done stayed open: see awaitTold
}

type worker struct {
	id  int
	cli *Client
	lk  Locker
}

// Start runs w on env under the lock name until Stop, which t.Cleanup also calls.
func (env *Env) Start(t testing.TB, w Workload, name string) *Run {
	t.Helper()
	r := env.newRun(t, w, name)
	for i := range workers {
		cli := env.workerClient(t, i)
		r.addWorker(t, cli)
	}
	r.launch(t, r.work)
	return r
}

// newRun prepares a run of w on env under the lock name, with no worker yet.
func (env *Env) newRun(t testing.TB, w Workload, name string) *Run {
	t.Helper()
	if err := w.validate(); err != nil {
		t.Fatal(err)
	}
	r := &Run{env: env, w: w, name: name, data: name + "-data/", hist: newHistory(), stop: make(chan struct{})}
	r.counter = r.data + "register"
	if prefix := w.Prefix(name); strings.HasPrefix(r.data, prefix) {
		t.Fatalf("faulttest: the data %q would queue under the lock's prefix %q", r.data, prefix)
	}
	return r
}

// addWorker opens a handle on the run's lock over cli for a new worker.
func (r *Run) addWorker(t testing.TB, cli *Client) *worker {
	t.Helper()
	lk, err := r.w.Open(cli.Client, r.name)
	if err != nil {
		t.Fatal(err)
	}
	wk := &worker{id: len(r.workers), cli: cli, lk: lk}
	r.workers = append(r.workers, wk)
	return wk
}

// launch starts the workers on work, the readers (if the workload has any, on clients of
// their own) and the background writes; Stop ends them, and t.Cleanup calls Stop.
func (r *Run) launch(t testing.TB, work func(context.Context, *worker)) {
	t.Helper()
	if r.w.OpenReader != nil {
		r.openReaders(t)
	}
	lockCtx, cancel := context.WithCancel(context.Background())
	r.stopLocks = cancel
	for _, wk := range r.workers {
		r.wg.Go(func() { work(lockCtx, wk) })
	}
	for _, rd := range r.readers {
		r.wg.Go(func() { r.read(lockCtx, rd) })
	}
	r.wg.Go(r.noise)
	t.Cleanup(r.Stop)
}

// workerClient returns a new client for the worker numbered i: half of them pinned to a
// member, half balanced over all of them (a Txn and its watch on different members), the
// two ways clients meet a cluster.
func (env *Env) workerClient(t testing.TB, i int) *Client {
	t.Helper()
	if i%2 == 1 {
		return env.SpreadClient(t, i%env.Cluster.Size())
	}
	return env.Client(t, i%env.Cluster.Size())
}

// History is the run's record.
func (r *Run) History() *History { return r.hist }

// Stop lets every worker finish its cycle (release included) and waits for them. Idempotent.
func (r *Run) Stop() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.stopLocks()
	r.wg.Wait()
}

func (r *Run) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// work runs cycles of lock, fenced writes, unlock until Stop.
func (r *Run) work(ctx context.Context, wk *worker) {
	for !r.stopped() {
		call := r.hist.Now()
		lctx, cancel := context.WithTimeout(ctx, lockTimeout)
		err := wk.lk.Lock(lctx)
		cancel()
		if err != nil {
			// No token, nothing the model can see; its key, if any, is deleted or expires.
			r.hist.lockFailed(wk.id, Acquire, call, err)
			r.wait(pause)
			continue
		}
		token := wk.lk.Token()
		r.hist.add(Op{Worker: wk.id, Kind: Acquire, Token: token, Units: unitsOf(wk.lk), Call: call, Return: r.hist.Now()})
		r.tellEarly(wk)
		r.writeUnderHold(wk, token)
		r.release(wk, token)
	}
}

// noise writes large values outside the lock's prefix every noiseEvery until Stop, as the
// lag test does: followers then apply behind the leader, so that waiters on them watch from
// a past the leader has left. It compacts now and then, as etcd's auto-compaction would, so
// that the store stays small over a soak.
func (r *Run) noise() {
	tick := time.NewTicker(noiseEvery)
	defer tick.Stop()
	value := strings.Repeat("x", noiseSize)
	for i := 1; ; i++ {
		select {
		case <-tick.C:
		case <-r.stop:
			return
		}
		ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), opTimeout)
		resp, err := r.env.Admin.Put(ctx, r.data+"noise/"+strconv.Itoa(i%8), value)
		if err == nil && i%noiseCompact == 0 { // errors: during a fault
			_, _ = r.env.Admin.Compact(ctx, resp.Header.Revision)
		}
		cancel()
	}
}

// wait pauses for d, or until Stop.
func (r *Run) wait(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-r.stop:
	}
}

// holdLimit bounds a hold's attempts to write: long enough for a holder cut off for a TTL
// and more to come back and find its hold gone.
func (r *Run) holdLimit() time.Duration { return 3*r.w.TTL + holdMargin }

// writeUnderHold makes writesPerHold accepted writes, stopping at the first refused one
// (the hold is gone) or at holdLimit.
func (r *Run) writeUnderHold(wk *worker, token int64) {
	deadline := time.Now().Add(r.holdLimit())
	for accepted := 0; accepted < writesPerHold && time.Now().Before(deadline); {
		switch r.fencedWrite(wk, token) {
		case OK:
			accepted++
		case Refused:
			r.awaitTold(wk, token)
			return
		default:
			time.Sleep(pause) // paces retries against a member that is down: no event to await
		}
	}
}

// toldWithin bounds how long a hold whose key etcd no longer has (its fenced write was
// refused) may go on without its Done closing: the loss is news of a delete event, or of the
// session's local deadline, which comes before the lease can expire. Generous, for a loaded
// machine; a hold that is never told fails it all the same.
const toldWithin = 10 * time.Second

// awaitTold checks, for a Locker whose holds report their own loss (a doner), that the
// hold token, whose fenced write etcd has just refused (its key is gone, or another's), is
// told: its Done closes within toldWithin. Whoever called Done first started the hold's watch: for some holds that is
// this call, long after the grant (see tellEarly, and the explorer's draw), so that a watch
// placed after a compaction past the token is tried too.
func (r *Run) awaitTold(wk *worker, token int64) {
	t, ok := wk.lk.(doner)
	if !ok {
		return
	}
	timer := time.NewTimer(toldWithin)
	defer timer.Stop()
	select {
	case <-t.Done():
	case <-timer.C:
		r.untoldMu.Lock()
		defer r.untoldMu.Unlock()
		r.untold = append(r.untold, fmt.Sprintf("worker %d: hold %d was gone (a fenced write refused at %v) and its Done still open %v later",
			wk.id, token, r.hist.Now()-toldWithin, toldWithin))
	}
}

// tellEarly starts the watch of a fresh hold at once, for half of the workers: the others
// start it only when a fenced write finds the hold gone (awaitTold).
func (r *Run) tellEarly(wk *worker) {
	if t, ok := wk.lk.(doner); ok && wk.id%2 == 0 {
		_ = t.Done()
	}
}

// fencedWrite reads the register and writes its successor and a marker key named after a
// unique write ID, in one Txn fenced by the hold's IsOwner. It records the write unless the
// read failed (then nothing was attempted, and it returns Ambiguous).
func (r *Run) fencedWrite(wk *worker, token int64) Outcome {
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), opTimeout)
	defer cancel()
	resp, err := wk.cli.Get(ctx, r.counter)
	if err != nil {
		return Ambiguous
	}
	var read int64
	if len(resp.Kvs) == 1 {
		if read, err = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64); err != nil {
			panic(fmt.Sprintf("faulttest: register %q holds %q", r.counter, resp.Kvs[0].Value))
		}
	}
	if strike := r.strike.Swap(nil); strike != nil {
		(*strike)(wk, token)
	}
	id := r.writeIDs.Add(1)
	op := Op{Worker: wk.id, Kind: Write, Token: token, WriteID: id, Read: read, Call: r.hist.Now()}
	then := []clientv3.Op{
		clientv3.OpPut(r.counter, strconv.FormatInt(read+1, 10)),
		clientv3.OpPut(r.marker(id), strconv.FormatInt(token, 10)),
	}
	if r.w.slots() > 1 {
		// Holders at once may write at once: a compare on the register's version keeps
		// their increments; a conflict is neither accepted nor a loss, and is retried.
		then = []clientv3.Op{clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(r.counter), "=", modRevision(resp))}, then, nil)}
	}
	tresp, err := wk.cli.Txn(ctx).If(ownerCmps(wk.lk)...).Then(then...).Commit()
	op.Return = r.hist.Now()
	switch {
	case err != nil:
		op.Outcome, op.Err = Ambiguous, err
	case !tresp.Succeeded:
		op.Outcome = Refused
	case r.w.slots() > 1 && !tresp.Responses[0].GetResponseTxn().Succeeded:
		return Ambiguous // the version conflict: nothing written, nothing recorded
	}
	r.hist.add(op)
	return op.Outcome
}

func modRevision(resp *clientv3.GetResponse) int64 {
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}

func (r *Run) marker(id int64) string { return r.data + "marker/" + strconv.FormatInt(id, 10) }

// releaseLimit bounds the retries of an Unlock whose outcome is unknown: at least as long as
// a fault may cut a holder off (the serve bound), so that its Unlock is still retried when
// the fault heals and can say whether the hold was lost.
func (r *Run) releaseLimit() time.Duration { return r.w.serveBound() + releaseMargin }

// release unlocks, retrying while the outcome is unknown, and records the last outcome. A
// handle whose Unlock never got an answer may stay taken: the worker opens a new one.
func (r *Run) release(wk *worker, token int64) {
	op := Op{Worker: wk.id, Kind: Release, Token: token, Call: r.hist.Now()}
	op.Outcome, op.Err = r.unlockUntilKnown(wk.lk.Unlock)
	op.Return = r.hist.Now()
	r.hist.add(op)
	if op.Outcome == Ambiguous {
		if lk, err := r.w.Open(wk.cli.Client, r.name); err == nil {
			wk.lk = lk
		}
	}
}

// unlockUntilKnown calls unlock (an Unlock or RUnlock) until it says whether the hold was
// released (OK) or lost before (Refused), or releaseLimit has passed (Ambiguous), and
// returns that outcome with the last error.
func (r *Run) unlockUntilKnown(unlock func(context.Context) error) (Outcome, error) {
	deadline := time.Now().Add(r.releaseLimit())
	for {
		ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), opTimeout)
		err := unlock(ctx)
		cancel()
		switch {
		case err == nil:
			return OK, nil
		case errors.Is(err, r.w.Lost):
			return Refused, err
		case time.Now().After(deadline):
			return Ambiguous, err
		}
		time.Sleep(pause) // paces retries against a member that is down: no event to await
	}
}

// beforeNextWrite calls f once, on the goroutine of the next worker to make a fenced write,
// between the write's read of the register and its Txn: in the middle of a hold.
func (r *Run) beforeNextWrite(f func(wk *worker, token int64)) { r.strike.Store(&f) }
