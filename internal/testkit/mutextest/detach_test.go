package mutex_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestDetachAndResumeKeepTheHoldAndItsToken: a detached hold still holds the name (a waiter
// waits, on another client, and a Lock of the detaching handle itself) with its key on a
// lease of its own; Resume on another client takes it over with the same key and token, a
// second Resume of the ticket is stale, and the resumed Unlock serves the waiters and
// revokes the detached lease; a Resume after that is stale too.
func TestDetachAndResumeKeepTheHoldAndItsToken(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "detach-resume"
	cli, admin := cluster.Client(t), cluster.Client(t)
	m := newMutex(t, cli, name)
	require.NoError(t, m.Lock(ctx))
	key, token := m.Key(), m.Token()
	shared := leaseOf(t, admin, key)
	ticket, err := m.Detach(ctx)
	require.NoError(t, err)
	assert.Zero(t, m.Token(), "the handle holds nothing once detached")
	etcdtest.Within(t, m.Done(), time.Second, "the detached hold's Done")
	detached := leaseOf(t, admin, key)
	assert.NotEqual(t, shared, detached, "the key moved to a lease of its own")
	assert.Equal(t, token, createRev(t, admin, key), "the key's create revision (its token) is kept")

	waiter := newMutex(t, cluster.Client(t), name)
	served := etcdtest.Async(func() error { return waiter.Lock(ctx) })
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 2)
	again := etcdtest.Async(func() error { return m.Lock(ctx) }) // the same handle, a new key
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 3)
	etcdtest.Pending(t, served, "a waiter behind the detached hold")

	r, err := mutex.Resume(ctx, cluster.Client(t), ticket)
	require.NoError(t, err)
	assert.Equal(t, token, r.Token())
	assert.Equal(t, key, r.Key())
	_, err = mutex.Resume(ctx, cluster.Client(t), ticket)
	assert.ErrorIs(t, err, mutex.ErrStaleTicket, "a ticket resumes once")

	require.NoError(t, r.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, served, 20*time.Second, "the waiter, once the resumed hold is released"))
	require.NoError(t, waiter.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, again, 20*time.Second, "the detaching handle's own Lock"))
	require.NoError(t, m.Unlock(ctx))
	assert.Eventually(t, func() bool {
		resp, err := admin.TimeToLive(ctx, detached)
		return err == nil && resp.TTL == -1
	}, 10*time.Second, 20*time.Millisecond, "the detached lease is revoked once its hold ended")
	_, err = mutex.Resume(ctx, cluster.Client(t), ticket)
	assert.ErrorIs(t, err, mutex.ErrStaleTicket)
	assert.Zero(t, etcdtest.CountKeys(t, admin, core.NamePrefix(name)))
}

// TestADetachedHoldLastsItsTTL: nobody renews a detached hold: a waiter is served once its
// lease's TTL has run out, and its ticket is stale then.
func TestADetachedHoldLastsItsTTL(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "detach-ttl"
	m := newMutex(t, cluster.Client(t), name, mutex.WithTTL(2*time.Second))
	require.NoError(t, m.Lock(ctx))
	ticket, err := m.Detach(ctx)
	require.NoError(t, err)
	detached := time.Now()
	waiter := newMutex(t, cluster.Client(t), name)
	require.NoError(t, waiter.Lock(ctx))
	assert.GreaterOrEqual(t, time.Since(detached), time.Second, "served before the detached lease could expire")
	_, err = mutex.Resume(ctx, cluster.Client(t), ticket)
	assert.ErrorIs(t, err, mutex.ErrStaleTicket)
	require.NoError(t, waiter.Unlock(ctx))
}

// TestResumeRefusesBadTicketsAndWritesNothing: a malformed ticket, or one whose key is not
// a Mutex's under the prefix given, is ErrInvalidOption before any request.
func TestResumeRefusesBadTicketsAndWritesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	cli := cluster.Client(t)
	m := newMutex(t, cli, "detach-bad")
	require.NoError(t, m.Lock(ctx))
	ticket, err := m.Detach(ctx)
	require.NoError(t, err)
	before := etcdtest.Revision(t, cli)
	for _, tc := range []struct {
		ticket string
		opts   []mutex.Option
	}{
		{"", nil}, {"garbage", nil}, {"t1.x.1.1.a2V5", nil}, {"t2" + ticket[2:], nil},
		{ticket, []mutex.Option{mutex.WithPrefix("elsewhere/")}},
	} {
		_, err := mutex.Resume(ctx, cli, tc.ticket, tc.opts...)
		assert.ErrorIs(t, err, mutex.ErrInvalidOption, "%q", tc.ticket)
	}
	etcdtest.NoWrites(t, cli, before, "a bad ticket wrote")
	r, err := mutex.Resume(ctx, cli, ticket)
	require.NoError(t, err)
	require.NoError(t, r.Unlock(ctx))
}

func leaseOf(t *testing.T, cli *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the key %s", key)
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

func createRev(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the key %s", key)
	return resp.Kvs[0].CreateRevision
}

// handTicket is the ticket anyone who can read key builds for it: its lease, create and
// mod revisions, as `etcdctl get -w json` shows them.
func handTicket(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the key %s", key)
	kv := resp.Kvs[0]
	return core.Ticket{Key: key, Lease: clientv3.LeaseID(kv.Lease), Token: kv.CreateRevision, Nonce: kv.ModRevision}.String()
}

// TestATicketBuiltByHandTakesNothing: a ticket names only a detached hold. One built by
// hand for a live hold (on a lease that carries another hold of its client too), for a
// waiter, for a waiter's key moved by hand onto a lease of its own and marked, or for a
// hold resumed already is stale for Resume, RenewTicket and ReleaseTicket alike: nothing is
// written, no lease revoked, and the live holds go on.
func TestATicketBuiltByHandTakesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "detach-forged"
	cli, admin, other := cluster.Client(t), cluster.Client(t), cluster.Client(t)
	m := newMutex(t, cli, name)
	require.NoError(t, m.Lock(ctx))
	also := newMutex(t, cli, name+"-also") // a second hold on the victim's shared lease
	require.NoError(t, also.Lock(ctx))
	waiter := newMutex(t, other, name)
	served := etcdtest.Async(func() error { return waiter.Lock(ctx) })
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 2)
	waiterKey := waiter.Key()

	// A waiter's key moved by hand onto a lease of its own and marked as Detach marks.
	moved := newMutex(t, other, name)
	movedWait := etcdtest.Async(func() error { return moved.Lock(ctx) })
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 3)
	own, err := admin.Grant(ctx, 60)
	require.NoError(t, err)
	_, err = admin.Put(ctx, moved.Key(), "detached host=h pid=1 since=2026-11-29T00:00:00Z", clientv3.WithLease(own.ID))
	require.NoError(t, err)

	forged := map[string]string{
		"a live hold":                       handTicket(t, admin, m.Key()),
		"a waiter":                          handTicket(t, admin, waiterKey),
		"a waiter moved by hand and marked": handTicket(t, admin, moved.Key()),
	}
	before := etcdtest.Revision(t, admin)
	for what, ticket := range forged {
		_, err := mutex.Resume(ctx, cluster.Client(t), ticket)
		assert.ErrorIs(t, err, mutex.ErrStaleTicket, "Resume of %s", what)
		tk, err := core.ParseTicket(ticket)
		require.NoError(t, err)
		_, err = core.RenewTicket(ctx, admin, tk)
		if what != "a waiter moved by hand and marked" { // it is marked and alone: renewable, never resumable
			assert.ErrorIs(t, err, mutex.ErrStaleTicket, "RenewTicket of %s", what)
			assert.ErrorIs(t, core.ReleaseTicket(ctx, admin, tk), mutex.ErrStaleTicket, "ReleaseTicket of %s", what)
		}
	}
	etcdtest.NoWrites(t, admin, before, "a ticket built by hand wrote")
	assert.NoError(t, m.Err(), "the holder goes on")
	assert.NoError(t, also.Err(), "the other hold on its lease goes on")
	alive, err := admin.TimeToLive(ctx, leaseOf(t, admin, m.Key()))
	require.NoError(t, err)
	assert.Positive(t, alive.TTL, "the victim's shared lease lives")
	etcdtest.Pending(t, served, "the waiter, behind the live hold")
	_, err = admin.Revoke(ctx, own.ID)
	require.NoError(t, err)
	assert.Error(t, etcdtest.Within(t, movedWait, 20*time.Second, "the waiter whose key was moved by hand"))

	// A hold resumed already: neither its ticket nor one built from its key now resumes.
	require.NoError(t, m.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, served, 20*time.Second, "the waiter"))
	ticket, err := waiter.Detach(ctx)
	require.NoError(t, err)
	r, err := mutex.Resume(ctx, cluster.Client(t), ticket)
	require.NoError(t, err)
	for what, tk := range map[string]string{"its ticket": ticket, "one built from its key": handTicket(t, admin, r.Key())} {
		_, err := mutex.Resume(ctx, cluster.Client(t), tk)
		assert.ErrorIs(t, err, mutex.ErrStaleTicket, "a resumed hold, %s", what)
	}
	assert.NoError(t, r.Err(), "the resumed hold goes on")
	require.NoError(t, r.Unlock(ctx))
	require.NoError(t, also.Unlock(ctx))
}

// TestAResumeWhoseAnswerNeverComesResumes: Resume's Txn is applied but its answer never
// comes; the try's bound passes and Resume sends it again, which finds the key written by
// its own earlier try (the value names the Resume) and resumes, where it said ErrStaleTicket
// ("the ticket was used") and left the key to its TTL with nobody renewing it. A second
// Resume of the ticket is still stale.
func TestAResumeWhoseAnswerNeverComesResumes(t *testing.T) {
	t.Parallel()
	ctx := etcdtest.Context(t)
	const name = "resume-answer-never-comes"
	m := newMutex(t, cluster.Client(t), name)
	require.NoError(t, m.Lock(ctx))
	token := m.Token()
	ticket, err := m.Detach(ctx)
	require.NoError(t, err)

	inj := &etcdtest.Injector{}
	cli := inj.Client(t, cluster)
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Drop, Times: 1})
	r, err := mutex.Resume(ctx, cli, ticket)
	require.NoError(t, err)
	assert.Equal(t, token, r.Token())
	assert.NoError(t, r.Err(), "the resumed hold holds")
	_, err = mutex.Resume(ctx, cluster.Client(t), ticket)
	assert.ErrorIs(t, err, mutex.ErrStaleTicket, "a ticket resumes once")
	require.NoError(t, r.Unlock(ctx))
	etcdtest.AwaitKeys(t, cluster.Client(t), core.NamePrefix(name), 0)
}
