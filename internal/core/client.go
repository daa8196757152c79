package core

import (
	"context"
	"sync"

	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// clientState is everything core keeps for one client: its shared sessions (one per TTL),
// its watches on names (hubs), the watch of its holds' keys, the cleanups still to do, and
// what it has seen of the cluster's history. It lives as long as the client: closing the
// client ends every goroutine of it (each runs under the client's context) and drops it.
// Its goroutines run only while there is work: a hub while a name is watched, the keyWatch
// while a hold is, the janitor while a cleanup is left; after Shutdown nothing is left but
// the clock, which keeps tokens from going back should the cluster do so.
type clientState struct {
	cli     *clientv3.Client
	clock   clock
	janitor janitor
	keys    *keyWatch

	mu      sync.Mutex // guards shared, hubs and waiting; never held while a hub's lock is awaited for long
	shared  map[int64]*sharedSession
	hubs    map[hubKey]*hub
	waiting map[hubKey]int // the client's waiters in each name's line (see pooled)
}

// clients holds the state of every client in use, the one registry of core.
var (
	clientsMu sync.Mutex
	clients   = map[*clientv3.Client]*clientState{}
)

// stateOf returns cli's state, made on first use; it is dropped when the client closes.
func stateOf(cli *clientv3.Client) *clientState {
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if st, ok := clients[cli]; ok {
		return st
	}
	st := &clientState{cli: cli, janitor: janitor{cli: cli}, keys: newKeyWatch(cli),
		shared: map[int64]*sharedSession{}, hubs: map[hubKey]*hub{}, waiting: map[hubKey]int{}}
	clients[cli] = st
	context.AfterFunc(cli.Ctx(), func() {
		clientsMu.Lock()
		delete(clients, cli)
		clientsMu.Unlock()
	})
	return st
}

// clockOf returns the clock of cli.
func clockOf(cli *clientv3.Client) *clock { return &stateOf(cli).clock }

// janitorOf returns the janitor of cli.
func janitorOf(cli *clientv3.Client) *janitor { return &stateOf(cli).janitor }

// ErrRewound is why holds and waits end when the cluster went back in time: an operator
// restored a member from an older snapshot, or forced a new cluster from a member that
// lagged. Revisions then go back, keys written since are gone without a delete event, and
// released keys come back on leases that still live: nothing this client learned of the
// name holds any more. It comes wrapped in ErrLost.
var ErrRewound = errors.New("etcdsync: the etcd cluster went back in time (restored from an older snapshot, or forced from a member that lagged)")

// A clock is what one client has seen of the cluster's history: the highest revision any
// response carried, and the cluster's ID. Every revision a member reports has been
// committed, so a linearizable answer (a Txn, a linearizable read) to a request sent after
// the client saw revision R can never carry a lower one in the same life of the cluster;
// one that does proves the cluster went back. (Requests under way at once are answered in
// any order, so an answer is compared with what was seen when its request was sent, never
// with what was seen since.) A lease renewal is answered by whichever member the client
// reached, which may apply behind the others: a lower revision there is only a suspicion,
// which one linearizable read settles.
type clock struct {
	mu      sync.Mutex
	max     int64
	cluster uint64
	// left are the clusters whose answers came before cluster's: a cluster that goes back
	// in time may get a new ID, never one it had, so an answer from one of them again means
	// answers from two clusters in turn.
	left []uint64
	// floor is the highest revision seen before the cluster last went back: every token this
	// client handed out is at most that, so a new hold's token must be above it.
	floor int64
	// confirmed is when confirm was last answered.
	confirmed time.Time
}

// now is the highest revision seen: every key created after it is newer than anything this
// client has seen.
func (c *clock) now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max
}

// linear records the header of a linearizable answer to a request sent when the clock said
// sent (its now then), and returns ErrRewound (with what was seen) if its revision is below
// sent, or its cluster is another. The clock then starts over from this answer: the
// cluster's new life.
func (c *clock) linear(h *pb.ResponseHeader, sent int64) error {
	if h == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	switch {
	case c.otherCluster(h) && slices.Contains(c.left, h.ClusterId):
		err = fmt.Errorf("%w: answers from cluster %x and cluster %x in turn", ErrMixedClusters, h.ClusterId, c.cluster)
	case c.otherCluster(h):
		err = fmt.Errorf("%w: cluster ID %x after %x", ErrRewound, h.ClusterId, c.cluster)
	case h.Revision < sent:
		err = fmt.Errorf("%w: revision %d after %d", ErrRewound, h.Revision, sent)
	}
	if err != nil {
		c.floor = max(c.floor, c.max)
	}
	if err != nil || h.Revision > c.max {
		c.max = h.Revision
	}
	c.setCluster(h)
	return err
}

// otherCluster reports whether h is from another cluster than the answers before it.
func (c *clock) otherCluster(h *pb.ResponseHeader) bool {
	return c.cluster != 0 && h.ClusterId != 0 && h.ClusterId != c.cluster
}

// setCluster records h's cluster as the one answers come from.
func (c *clock) setCluster(h *pb.ResponseHeader) {
	if c.otherCluster(h) && !slices.Contains(c.left, c.cluster) {
		c.left = append(c.left, c.cluster)
	}
	if h.ClusterId != 0 {
		c.cluster = h.ClusterId
	}
}

// above returns nil if a hold at token rev may be granted: a token never goes below one
// this client handed out before the cluster went back in time. Until the cluster's
// revisions pass that (or etcd 3.6's restore bumped them past it), acquisitions fail.
func (c *clock) above(rev int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev > c.floor {
		return nil
	}
	return fmt.Errorf("%w: %w: token %d is not above revision %d, seen before the cluster went back; restart the client, or restore etcd with --bump-revision", ErrLost, ErrRewound, rev, c.floor)
}

// suspect records the header of an answer from a member that may apply behind, and reports
// whether it calls for a linearizable read to settle it (see confirm).
func (c *clock) suspect(h *pb.ResponseHeader) bool {
	if h == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.Revision < c.max || c.otherCluster(h) {
		return true
	}
	c.max = h.Revision
	c.setCluster(h)
	return false
}

// clockKey is the key that a read to learn the cluster's revision counts: none has it.
const clockKey = "\x00etcdsync-clock"

// confirm settles a suspicion with one linearizable read (a count of no key), and returns
// ErrRewound if the cluster went back; nil if it did not, or if the read failed (the next
// renewal looks again).
func (c *clock) confirm(ctx context.Context, cli *clientv3.Client) error {
	sent := c.now()
	resp, err := cli.Get(clientv3.WithRequireLeader(ctx), clockKey, clientv3.WithCountOnly())
	if err != nil {
		return nil
	}
	c.mu.Lock()
	c.confirmed = time.Now()
	c.mu.Unlock()
	return c.linear(resp.Header, sent)
}

// confirmEvery is confirm, unless one was answered within d: so that the waits of one
// client that each probe the cluster (see follow.go) send one read per d between them.
func (c *clock) confirmEvery(ctx context.Context, cli *clientv3.Client, d time.Duration) error {
	c.mu.Lock()
	recent := time.Since(c.confirmed) < d
	c.mu.Unlock()
	if recent {
		return nil
	}
	return c.confirm(ctx, cli)
}

// settleLinear is linear for an answer that a call acts on: if the cluster went back in
// time, it rewinds cli and returns the call's error, ErrLost wrapping why; nil otherwise.
func settleLinear(cli *clientv3.Client, h *pb.ResponseHeader, sent int64) error {
	rw := clockOf(cli).linear(h, sent)
	if rw == nil {
		return nil
	}
	rewind(cli, rw)
	return fmt.Errorf("%w: %w", ErrLost, rw)
}

// rewind ends everything cli holds or waits for because the cluster went back in time
// (cause, an ErrRewound): every shared session ends with it, and its lease is revoked at
// once, since it may have come back with keys this client had released; every watch of the
// client on a name is closed and its subscribers told, so that waiters fail and observers
// start over from what is true now. The next acquisition takes a new lease.
func rewind(cli *clientv3.Client, cause error) {
	for _, s := range sharedOf(cli) {
		for _, sess := range s.take() {
			sess.end(cause)
			sess.ka.retire()
		}
	}
	closeHubs(cli, fmt.Errorf("%w: %w", ErrLost, cause))
}

// ErrMixedClusters is why an acquisition fails when the client's endpoints are members of
// different etcd clusters: its balancer takes requests to them in turn, so a lease granted
// by one is "not found" by the other, and a lock taken on one excludes nobody on the other.
// The error names each cluster's ID in hex, as etcd prints it. No retry helps: fix the
// endpoints.
var ErrMixedClusters = errors.New("etcdsync: the client's endpoints are members of different etcd clusters")

// probeWait bounds the check of the endpoints' clusters, and the revoke of a lease that a
// cluster other than the one that refused it granted.
const probeWait = 2 * time.Second

// clustersOf asks each endpoint of cli, at once, for its cluster's ID: one Status on a
// connection to that endpoint alone, with the client's credentials. It returns the
// endpoints of each cluster ID; an endpoint that does not answer within probeWait is left out.
func clustersOf(ctx context.Context, cli *clientv3.Client) map[uint64][]string {
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	found := map[uint64][]string{}
	for _, ep := range cli.Endpoints() {
		wg.Go(func() {
			resp, err := cli.Maintenance.Status(ctx, ep)
			if err != nil || resp.Header == nil || resp.Header.ClusterId == 0 {
				return
			}
			mu.Lock()
			found[resp.Header.ClusterId] = append(found[resp.Header.ClusterId], ep)
			mu.Unlock()
		})
	}
	wg.Wait()
	return found
}

// OneCluster returns ErrMixedClusters, naming each cluster and its endpoints, if the
// endpoints of cli that answer within 2 s are members of different clusters; else nil. It
// costs a connection and a Status per endpoint.
func OneCluster(ctx context.Context, cli *clientv3.Client) error {
	return mixedClusters(clustersOf(ctx, cli))
}

// mixedClusters is ErrMixedClusters naming each cluster of found and its endpoints, or nil
// if found holds one cluster or none.
func mixedClusters(found map[uint64][]string) error {
	if len(found) < 2 {
		return nil
	}
	var each []string
	for _, id := range slices.Sorted(maps.Keys(found)) {
		each = append(each, fmt.Sprintf("cluster %x at %s", id, strings.Join(slices.Sorted(slices.Values(found[id])), ", ")))
	}
	return fmt.Errorf("%w: %s", ErrMixedClusters, strings.Join(each, "; "))
}

// revokeOn revokes lease id through the endpoints of one cluster, one after the other until
// one answers, within probeWait: the balancer could take the revoke to another cluster,
// which would only say "not found". Best effort: a lease left behind expires after its TTL.
func revokeOn(ctx context.Context, cli *clientv3.Client, endpoints []string, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeWait)
	defer cancel()
	for _, ep := range endpoints {
		conn, err := cli.Dial(ep)
		if err != nil {
			continue
		}
		_, err = pb.NewLeaseClient(conn).LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: int64(id)})
		conn.Close()
		if err == nil || errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
			return
		}
	}
}

// A chore is cleanup that must be finished although the call that needed it has returned:
// removing the key of an acquisition that failed while etcd could not be reached, or
// releasing a hold its owner gave up. Left undone, such a key sits on a lease the shared
// session keeps renewing, and blocks the name for the client's lifetime.
type chore interface {
	// attempt tries once, under ctx; done when nothing is left to do.
	attempt(ctx context.Context) (done bool)
	// drop gives up: the client is closed, and the lease goes with it.
	drop()
}

// A janitor does the chores of one client in the background, retrying each until it is
// done; its goroutine runs only while it has chores, and ends when the client closes.
type janitor struct {
	cli *clientv3.Client

	mu      sync.Mutex
	chores  []chore
	running bool
}

// Tidy gives cli's janitor a chore of a package outside the core: attempt, tried until it
// reports done, or until the client closes (whatever it left then goes with the lease).
func Tidy(cli *clientv3.Client, attempt func(ctx context.Context) (done bool)) {
	janitorOf(cli).add(choreFunc(attempt))
}

type choreFunc func(ctx context.Context) bool

func (f choreFunc) attempt(ctx context.Context) bool { return f(ctx) }
func (choreFunc) drop()                              {}

func (j *janitor) add(c chore) {
	j.mu.Lock()
	j.chores = append(j.chores, c)
	start := !j.running
	j.running = true
	j.mu.Unlock()
	if start {
		go j.run()
	}
}

func (j *janitor) run() {
	var b Backoff
	for {
		j.mu.Lock()
		chores := j.chores
		j.chores = nil
		j.mu.Unlock()
		var left []chore
		for _, c := range chores {
			if j.cli.Ctx().Err() != nil {
				c.drop()
				continue
			}
			ctx, cancel := context.WithTimeout(j.cli.Ctx(), tryTimeout)
			if !c.attempt(ctx) {
				left = append(left, c)
			}
			cancel()
		}
		j.mu.Lock()
		j.chores = append(left, j.chores...)
		if len(j.chores) == 0 {
			j.running = false
			j.mu.Unlock()
			return
		}
		j.mu.Unlock()
		if len(left) > 0 {
			_ = b.wait(j.cli.Ctx()) // a closed client drops the chores on the next round
		}
	}
}

// keysCleanup is the chore of removing the keys of an acquisition that did not become a
// hold. Their slots stay claimed until the keys are known to be gone, so that a delete
// etcd applies late can never take the key of a slot's next acquisition.
type keysCleanup struct {
	cli   *clientv3.Client
	slots []*slot
	revs  []int64 // each key's create revision; 0 for a key known to be absent
	known bool    // revs are known; else they are read first
}

// attempt deletes the keys in one Txn, each fenced on its create revision (read first in
// one Txn if not known), so that it never takes a later key of the same slots.
//
// It deletes also on a session that ended: a session that ends at its local deadline has its
// lease revoked, but etcd may have kept the lease (a new leader extends leases), and the
// revoke may not get through for a while.
func (c *keysCleanup) attempt(ctx context.Context) bool {
	if !c.known {
		reads := make([]clientv3.Op, len(c.slots))
		for i, sl := range c.slots {
			reads[i] = clientv3.OpGet(sl.key(), clientv3.WithKeysOnly())
		}
		resp, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(reads...).Commit()
		if err != nil {
			return c.refused(err)
		}
		for i := range c.slots {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
				c.revs[i] = kvs[0].CreateRevision
			}
		}
		c.known = true
	}
	var deletes []clientv3.Op
	for i, sl := range c.slots {
		if c.revs[i] != 0 {
			deletes = append(deletes, fencedDelete(sl.key(), c.revs[i]))
		}
	}
	if len(deletes) > 0 {
		if _, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(deletes...).Commit(); err != nil {
			return c.refused(err)
		}
	}
	c.drop() // deleted now, or gone before
	return true
}

// refused ends the chore if etcd refused it for good (permission revoked): the keys then go
// with their lease, and a slot's next acquisition, finding its key, takes it over.
func (c *keysCleanup) refused(err error) bool {
	if Refused(err) {
		c.drop()
		return true
	}
	return false
}

func (c *keysCleanup) drop() {
	for _, sl := range c.slots {
		sl.free()
	}
}

// fencedDelete is an op that deletes key only if its create revision is rev: a nested Txn,
// so that one Txn can release several keys and say which of them it deleted.
func fencedDelete(key string, rev int64) clientv3.Op {
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)},
		[]clientv3.Op{clientv3.OpDelete(key)}, nil)
}

// Hooks for the tests in internal/testkit, which live in a module of their own (so that
// the library requires nothing they need) and so cannot use an export_test.go here. None
// of them is called by the library.

// Transient reports whether err is one that a retry may get past (see Retry).
func Transient(err error) bool { return transient(err) }

// StopKeepAlive stops the keep-alive of h's session without ending or revoking anything, as
// a keep-alive that returned by mistake would.
func StopKeepAlive(h *Hold) { h.sess.ka.stop() }

// StopMonitor stops the watch of h's key without ending the hold, as a goroutine of the
// client's keyWatch (or h's monitor, on a wrapped client) that returned by mistake would.
func StopMonitor(h *Hold) {
	h.mu.Lock()
	m := h.mon
	h.mu.Unlock()
	if m != nil {
		m.stop()
		h.waitMonitor()
		return
	}
	stateOf(h.cli).keys.crash()
}

// HeardByHub reports whether h's loss is watched by its client's hub of its name (see
// keeper), not by a watch of its own on the client's key watch.
func HeardByHub(h *Hold) bool {
	k := stateOf(h.cli).keys
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.holds[h]
	return e != nil && e.onHub
}

// crash ends run as a goroutine that returned by mistake would (a test's hook); with no run,
// it ends the holds whose keys the hubs watch as it would.
func (k *keyWatch) crash() {
	k.mu.Lock()
	if !k.running {
		k.loseAll(errMonitorStopped)
		return
	}
	k.crashed = true
	stop := k.stop
	k.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// KeyWatchPlaced reports whether every hold watched on the key watch of cli has a watch
// in place: created, and answered by etcd, on the open stream. For tests that must know
// that etcd has checked a hold's watch (a permission is checked when a watch starts).
func KeyWatchPlaced(cli *clientv3.Client) bool {
	k := stateOf(cli).keys
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.holds { // one a hub watches is in place: that hub's watch had started
		if !e.onHub && (e.id == 0 || e.checking) {
			return false
		}
	}
	return k.cur == nil || len(k.cur.pending) == 0
}

// NearAhead is how many keys may be ahead of a waiter for it to join its client's hub at
// once (see SetNearAhead).
func NearAhead() int { return int(nearAhead.Load()) }

// LingerDeletes is how many revisions with deletes an idle hub hears before it closes.
func LingerDeletes() int { return lingerDeletes() }

// HasHub reports whether cli has a watch of the name (open or lingering) for its waiters.
func HasHub(cli *clientv3.Client, name string) bool {
	k := hubKey{cli: cli, prefix: NamePrefix(name), mode: deletesOnly}
	if hasHub(k) {
		return true
	}
	k.mode = arrivals // an rwmutex's
	return hasHub(k)
}

// SetMaxLeaseKeys sets how many keys a shared lease carries before the next acquisition
// takes a new one, and returns what restores it; not for use beside other tests.
func SetMaxLeaseKeys(n int) (restore func()) {
	old := maxLeaseKeys.Swap(int64(n))
	return func() { maxLeaseKeys.Store(old) }
}
