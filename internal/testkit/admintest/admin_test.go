package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// TestBadInputReadsNothing: a bad name or option is refused with ErrInvalidName or
// ErrInvalidOption before any request.
func TestBadInputReadsNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	_, err := admin.Status(ctx, cli, []string{""})
	assert.ErrorIs(t, err, core.ErrInvalidName)
	_, err = admin.Status(ctx, cli, []string{"a"}, admin.Prefix("app"))
	assert.ErrorIs(t, err, core.ErrInvalidOption)
	err = admin.Watch(ctx, cli, []string{"a"}, func(*admin.Snapshot) error { return nil }, admin.Timeout(0))
	assert.ErrorIs(t, err, core.ErrInvalidOption)
	assert.Empty(t, cnt.Counts(), "a refused call sent requests")
}

// TestStatusShowsHoldersAndWaitersInOrder: the holders and waiters of a mutex, an rwmutex,
// a semaphore and an election, each in the order they are served, with the state the
// primitive's own rules give them and the hold's token, read at one revision.
func TestStatusShowsHoldersAndWaitersInOrder(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	const lock, rw, sem, elect = "admin-lock", "admin-rw", "admin-sem", "admin-elect"

	holder := must(mutex.New(cli, lock))
	require.NoError(t, holder.Lock(ctx))
	waiter := must(mutex.New(cluster.Client(t), lock))
	waiting(t, waiter.Lock, waiter.Unlock, lock, 2)

	reader := must(rwmutex.New(cli, rw))
	require.NoError(t, reader.RLock(ctx))
	writer := must(rwmutex.New(cluster.Client(t), rw))
	waiting(t, writer.Lock, writer.Unlock, rw, 2)

	s := must(semaphore.New(cli, sem, 2))
	p, err := s.AcquireN(ctx, 2)
	require.NoError(t, err)
	s2 := must(semaphore.New(cluster.Client(t), sem, 2))
	var p2 *semaphore.Permit
	waiting(t, func(ctx context.Context) (err error) { p2, err = s2.Acquire(ctx); return err },
		func(ctx context.Context) error { return p2.Release(ctx) }, sem, 4) // the limit's record and marker too

	leader := must(election.New(cli, elect))
	require.NoError(t, leader.Campaign(ctx, "first"))

	snap, err := admin.Status(ctx, cli, []string{lock, rw, sem})
	require.NoError(t, err)
	require.Len(t, snap.Names, 3)
	assert.Positive(t, snap.Revision)
	states := func(ns admin.NameStatus) (out []string) {
		for i, e := range ns.Queue {
			assert.Equal(t, i+1, e.Position)
			out = append(out, e.Kind+" "+e.State)
		}
		return out
	}
	assert.Equal(t, []string{"lock holds", "lock waits"}, states(snap.Names[0]))
	assert.Equal(t, holder.Token(), snap.Names[0].Queue[0].Token)
	assert.Equal(t, holder.Key(), snap.Names[0].Queue[0].Key)
	assert.NotNil(t, snap.Names[0].Queue[0].TTL)
	assert.Equal(t, "rwmutex", snap.Names[1].Primitive)
	assert.Equal(t, []string{"read holds", "write waits"}, states(snap.Names[1]))
	assert.Equal(t, "semaphore", snap.Names[2].Primitive)
	require.NotNil(t, snap.Names[2].Limit)
	assert.Equal(t, 2, *snap.Names[2].Limit)
	assert.Equal(t, []string{"permit holds", "permit waits"}, states(snap.Names[2]))
	assert.Equal(t, 2, snap.Names[2].Queue[0].Units)

	snap, err = admin.Status(ctx, cli, []string{elect}, admin.Elections())
	require.NoError(t, err)
	assert.Equal(t, []string{"candidate leads"}, states(snap.Names[0]))
	snap, err = admin.Status(ctx, cli, []string{elect})
	require.NoError(t, err)
	assert.Equal(t, []string{"lock holds"}, states(snap.Names[0]), "without Elections, a lock")

	// Without names, every name at the root (of this run's namespace).
	snap, err = admin.Status(ctx, cli, nil)
	require.NoError(t, err)
	var found []string
	for _, ns := range snap.Names {
		found = append(found, ns.Name)
	}
	assert.Subset(t, found, []string{lock, rw, sem, elect})

	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, reader.RUnlock(ctx))
	require.NoError(t, p.Release(ctx))
	require.NoError(t, leader.Resign(ctx))
}

// TestStatusKnowsHoldsThatChangedInPlace: a downgraded write hold shows as a write key in
// read mode that holds, with the readers behind it up to the next writer; an upgradable
// read as a write key in upgradable mode that holds beside readers, a second one waiting.
func TestStatusKnowsHoldsThatChangedInPlace(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	const down, up = "admin-downgraded", "admin-upgradable"
	states := func(name string) (out []string) {
		snap, err := admin.Status(ctx, cli, []string{name})
		require.NoError(t, err)
		for _, e := range snap.Names[0].Queue {
			out = append(out, strings.Join(strings.Fields(e.Kind+" "+e.Mode+" "+e.State), " "))
		}
		return out
	}

	w := must(rwmutex.New(cli, down))
	require.NoError(t, w.Lock(ctx))
	r := must(rwmutex.New(cluster.Client(t), down))
	rlocked := etcdtest.Async(func() error { return r.RLock(ctx) })
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(down), 2)
	w2 := must(rwmutex.New(cluster.Client(t), down))
	waiting(t, w2.Lock, w2.Unlock, down, 3)
	assert.Equal(t, []string{"write holds", "read waits", "write waits"}, states(down))
	require.NoError(t, w.Downgrade(ctx))
	require.NoError(t, etcdtest.Within(t, rlocked, 5*time.Second, "RLock behind the downgraded hold"))
	assert.Equal(t, []string{"write read holds", "read holds", "write waits"}, states(down))

	u := must(rwmutex.New(cli, up))
	require.NoError(t, u.ULock(ctx))
	r2 := must(rwmutex.New(cluster.Client(t), up))
	require.NoError(t, r2.RLock(ctx))
	u2 := must(rwmutex.New(cluster.Client(t), up))
	waiting(t, u2.ULock, u2.UUnlock, up, 3)
	assert.Equal(t, []string{"write upgradable holds", "read holds", "write upgradable waits"}, states(up))

	require.NoError(t, w.RUnlock(ctx))
	require.NoError(t, r.RUnlock(ctx))
	require.NoError(t, u.UUnlock(ctx))
	require.NoError(t, r2.RUnlock(ctx))
}

// TestWatchCallsBackAtEveryChange: Watch calls back with the present, then at every change
// of who holds or waits, and returns the callback's error when it returns one.
func TestWatchCallsBackAtEveryChange(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	const name = "admin-watch"
	seen := make(chan *admin.Snapshot, 16)
	stop := errors.New("enough")
	var calls int
	done := etcdtest.Async(func() error {
		return admin.Watch(ctx, cli, []string{name}, func(s *admin.Snapshot) error {
			calls++
			seen <- s
			if calls == 3 {
				return stop
			}
			return nil
		})
	})
	next := func(what string) *admin.Snapshot {
		t.Helper()
		select {
		case s := <-seen:
			return s
		case <-time.After(30 * time.Second):
			t.Fatalf("no call back for %s", what)
			return nil
		}
	}
	assert.Empty(t, next("the present").Names[0].Queue)
	m := must(mutex.New(cli, name))
	require.NoError(t, m.Lock(ctx))
	q := next("the lock").Names[0].Queue
	require.Len(t, q, 1)
	assert.Equal(t, admin.StateHolds, q[0].State)
	require.NoError(t, m.Unlock(ctx))
	assert.Empty(t, next("the unlock").Names[0].Queue)
	assert.ErrorIs(t, etcdtest.Within(t, done, 30*time.Second, "Watch's return"), stop)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// waiting starts lock, which must wait, and returns once name has n keys. When the test
// ends, the wait is cancelled, or the hold it got meanwhile released.
func waiting(t *testing.T, lock, release func(context.Context) error, name string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	done := etcdtest.Async(func() error { return lock(ctx) })
	t.Cleanup(func() {
		cancel()
		if <-done == nil {
			assert.NoError(t, release(context.Background()))
		}
	})
	etcdtest.AwaitKeys(t, cluster.Client(t), core.NamePrefix(name), int64(n))
}

// TestReleaseByTokenEndsTheHoldAndLeavesARecord: an operator's release of a mutex hold by its
// token deletes its key (its holder learns of the loss) and leaves a record that says why;
// a Multi's keys go in one Txn; a waiter's key too. A wrong token writes nothing.
func TestReleaseByTokenEndsTheHoldAndLeavesARecord(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	const name, a, b = "admin-release", "admin-release-a", "admin-release-b"

	m := must(mutex.New(cli, name))
	require.NoError(t, m.Lock(ctx))
	before := etcdtest.Revision(t, cli)
	assert.ErrorIs(t, admin.Release(ctx, cli, []string{name}, m.Token()+1000, "wrong"), admin.ErrNoHold)
	etcdtest.NoWrites(t, cli, before, "a release with a wrong token wrote")
	assert.ErrorIs(t, admin.Release(ctx, cli, []string{name}, 0, "none"), core.ErrInvalidOption)
	assert.ErrorIs(t, admin.Release(ctx, cli, nil, 1, "none"), core.ErrInvalidName)

	require.NoError(t, admin.Release(ctx, cli, []string{name}, m.Token(), "stuck since 02:00"))
	etcdtest.Within(t, m.Done(), 30*time.Second, "the holder's loss")
	assert.ErrorIs(t, m.Err(), core.ErrLost)
	assert.ErrorIs(t, m.Err(), core.ErrReleasedByOperator)
	assert.ErrorContains(t, m.Err(), "stuck since 02:00")
	resp, err := cli.Get(ctx, core.ReleaseRecordKey(core.NamePrefix(name), m.Key()))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the record")
	var rec admin.Record
	require.NoError(t, json.Unmarshal(resp.Kvs[0].Value, &rec))
	assert.Equal(t, "stuck since 02:00", rec.Reason)
	assert.Equal(t, m.Token(), rec.Token)
	assert.Contains(t, rec.By, "@")
	assert.NotZero(t, resp.Kvs[0].Lease, "the record goes with a lease")
	assert.ErrorIs(t, m.Unlock(ctx), core.ErrLost)

	multi := must(mutex.NewMulti(cli, []string{a, b}))
	require.NoError(t, multi.Lock(ctx))
	require.NoError(t, admin.Release(ctx, cli, []string{a, b}, multi.Token(), "both"))
	etcdtest.Within(t, multi.Done(), 30*time.Second, "the Multi's loss")
	assert.ErrorIs(t, multi.Err(), core.ErrReleasedByOperator)
	assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(a)))
	assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(b)))
	assert.ErrorIs(t, multi.Unlock(ctx), core.ErrLost)
}

// TestReleaseOfAWaiterEndsItsWait: an operator's release of a waiter's key ends its Lock with
// ErrReleasedByOperator (and ErrLost) and the reason, and leaves no key of it: a waiter near
// the head at once, one far back (which watches a key ahead, not its own) once that key goes.
func TestReleaseOfAWaiterEndsItsWait(t *testing.T) {
	for _, ahead := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d ahead", ahead), func(t *testing.T) {
			ctx := etcdtest.Context(t)
			cli := cluster.Client(t)
			name := fmt.Sprintf("admin-release-waiter-%d", ahead)
			holder := must(mutex.New(cli, name))
			require.NoError(t, holder.Lock(ctx))
			var others []<-chan error
			var otherMs []*mutex.Mutex
			for i := 1; i < ahead; i++ { // waiters ahead of the one released, each its own client
				m := must(mutex.New(cluster.Client(t), name))
				others = append(others, etcdtest.Async(func() error { return m.Lock(ctx) }))
				otherMs = append(otherMs, m)
				etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), int64(1+i))
			}
			waiter := must(mutex.New(cluster.Client(t), name))
			locked := etcdtest.Async(func() error { return waiter.Lock(ctx) })
			etcdtest.AwaitKeys(t, cli, core.NamePrefix(name), int64(1+ahead))

			snap, err := admin.Status(ctx, cli, []string{name})
			require.NoError(t, err)
			require.Len(t, snap.Names[0].Queue, 1+ahead)
			w := snap.Names[0].Queue[ahead]
			require.Equal(t, admin.StateWaits, w.State)
			require.NoError(t, admin.Release(ctx, cli, []string{name}, w.Token, "not today"))
			if ahead > 1 {
				require.NoError(t, holder.Unlock(ctx), "the key the far waiter watches goes")
			}
			err = etcdtest.Within(t, locked, 30*time.Second, "the waiter's end")
			assert.ErrorIs(t, err, core.ErrReleasedByOperator)
			assert.ErrorIs(t, err, core.ErrLost)
			assert.ErrorContains(t, err, "not today")
			if ahead == 1 {
				assert.Equal(t, int64(1), etcdtest.CountKeys(t, cli, core.NamePrefix(name)), "the holder's key alone")
				require.NoError(t, holder.Unlock(ctx))
			}
			for i, done := range others {
				require.NoError(t, etcdtest.Within(t, done, 30*time.Second, "a waiter ahead"))
				require.NoError(t, otherMs[i].Unlock(ctx))
			}
			assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(name)), "no key left")
		})
	}
}

// TestStatusShowsAnAskUntilTheRelease: Status shows an ask of a hold (Entry.Asked: the
// reason, who, the token) on that hold alone, not on the waiter behind it; once the hold
// that was told of it is released, the record is gone and so is the ask. Watch calls back
// when a hold is asked.
func TestStatusShowsAnAskUntilTheRelease(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	const name = "admin-ask-status"
	m := must(mutex.New(cli, name))
	require.NoError(t, m.Lock(ctx))
	waiter := must(mutex.New(cluster.Client(t), name))
	locked := etcdtest.Async(func() error { return waiter.Lock(ctx) })
	primtest.AwaitKeys(t, cli, name, 2)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	snaps := make(chan *admin.Snapshot, 100)
	watched := etcdtest.Async(func() error {
		return admin.Watch(wctx, cli, []string{name}, func(s *admin.Snapshot) error { snaps <- s; return nil })
	})
	first := etcdtest.Within(t, snaps, 30*time.Second, "the first snapshot")
	require.Len(t, first.Names[0].Queue, 2)
	assert.Nil(t, first.Names[0].Queue[0].Asked)

	require.NoError(t, admin.Ask(ctx, cli, name, m.Token(), "deploy at 02:00"))
	var asked *admin.Snapshot
	for asked == nil {
		s := etcdtest.Within(t, snaps, 30*time.Second, "a snapshot with the ask")
		if s.Names[0].Queue[0].Asked != nil {
			asked = s
		}
	}
	q := asked.Names[0].Queue
	assert.Equal(t, "deploy at 02:00", q[0].Asked.Reason)
	assert.Equal(t, m.Token(), q[0].Asked.Token)
	assert.Contains(t, q[0].Asked.By, "@")
	assert.Nil(t, q[1].Asked, "the waiter is not asked")
	stop()
	assert.ErrorIs(t, etcdtest.Within(t, watched, 30*time.Second, "Watch"), context.Canceled)

	etcdtest.Within(t, m.Asked(), 30*time.Second, "the holder is told")
	require.NoError(t, m.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, locked, 30*time.Second, "the waiter's Lock"))
	snap, err := admin.Status(ctx, cli, []string{name})
	require.NoError(t, err)
	require.Len(t, snap.Names[0].Queue, 1)
	assert.Nil(t, snap.Names[0].Queue[0].Asked, "the record went with the release")
	require.NoError(t, waiter.Unlock(ctx))
}
