package admin_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// TestEveryReleaseAfterAnOperatorsReleaseQuotesTheReason: the release of a hold that an
// operator released says ErrReleasedByOperator (and ErrLost) with the reason, whether or
// not its Done was ever asked for: a Mutex's Unlock, a Multi's, a permit's Release, an
// RUnlock; a release without a reason says so.
func TestEveryReleaseAfterAnOperatorsReleaseQuotesTheReason(t *testing.T) {
	ctx := etcdtest.Context(t)
	for _, watched := range []bool{false, true} {
		for _, reason := range []string{"stuck since 02:00", ""} {
			t.Run(fmt.Sprintf("watched=%v reason=%q", watched, reason), func(t *testing.T) {
				cli, op := cluster.Client(t), cluster.Client(t)
				tag := fmt.Sprintf("%v-%d", watched, len(reason))
				want := "no reason given"
				if reason != "" {
					want = fmt.Sprintf("%q", reason)
				}
				m := must(mutex.New(cli, "admin-reason-m-"+tag))
				multi := must(mutex.NewMulti(cli, []string{"admin-reason-a-" + tag, "admin-reason-b-" + tag}))
				s := must(semaphore.New(cli, "admin-reason-s-"+tag, 2))
				rw := must(rwmutex.New(cli, "admin-reason-rw-"+tag))
				require.NoError(t, m.Lock(ctx))
				require.NoError(t, multi.Lock(ctx))
				p, err := s.Acquire(ctx)
				require.NoError(t, err)
				require.NoError(t, rw.RLock(ctx))
				if watched {
					_, _, _, _ = m.Done(), multi.Done(), p.Done(), rw.Done()
				}
				rwKey := core.NamePrefix("admin-reason-rw-"+tag) + core.KindRead
				for _, r := range []struct {
					name  string
					token int64
				}{{"admin-reason-m-" + tag, m.Token()}, {"admin-reason-s-" + tag, p.Token()},
					{"admin-reason-rw-" + tag, firstToken(t, op, rwKey)}} {
					require.NoError(t, admin.Release(ctx, op, []string{r.name}, r.token, reason))
				}
				require.NoError(t, admin.Release(ctx, op, multi.Names(), multi.Token(), reason))
				if watched {
					for what, done := range map[string]<-chan struct{}{"mutex": m.Done(), "multi": multi.Done(), "permit": p.Done(), "read": rw.Done()} {
						etcdtest.Within(t, done, 30*time.Second, what+"'s loss")
					}
				}
				for what, err := range map[string]error{"Unlock": m.Unlock(ctx), "Multi.Unlock": multi.Unlock(ctx),
					"Permit.Release": p.Release(ctx), "RUnlock": rw.RUnlock(ctx)} {
					assert.ErrorIs(t, err, core.ErrReleasedByOperator, what)
					assert.ErrorIs(t, err, core.ErrLost, what)
					assert.ErrorContains(t, err, want, what)
				}
			})
		}
	}
}

func firstToken(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), prefix, clientv3.WithPrefix())
	require.NoError(t, err)
	require.NotEmpty(t, resp.Kvs, "a key under %s", prefix)
	return resp.Kvs[0].CreateRevision
}

// TestALeaseOfManyHoldsEndsThemAllAtOnce: when the lease that carries many watched holds
// ends, every one of them is told, and the client asks etcd about it a few times, not once
// per hold (a read each, one after another, told 10,000 holds over 14 s). An operator's
// release of some of them at the same time still reaches those with its reason.
func TestALeaseOfManyHoldsEndsThemAllAtOnce(t *testing.T) {
	const n = 600
	ctx := etcdtest.Context(t)
	cnt := &rpcstat.Counter{}
	cli, op := primtest.CountedClient(t, cluster, cnt), cluster.Client(t)
	ms := make([]*mutex.Mutex, n)
	names := make([]string, n)
	for i := range ms {
		names[i] = fmt.Sprintf("admin-many-%d", i)
		ms[i] = must(mutex.New(cli, names[i]))
		require.NoError(t, ms[i].Lock(ctx))
		_ = ms[i].Done()
	}
	// Two released by an operator first, with a reason: their leases live.
	for i, m := range ms[:2] {
		require.NoError(t, admin.Release(ctx, op, []string{names[i]}, m.Token(), "make room"))
	}
	for _, m := range ms[:2] {
		etcdtest.Within(t, m.Done(), 30*time.Second, "an operator's release")
		assert.ErrorIs(t, m.Err(), core.ErrReleasedByOperator)
		assert.ErrorContains(t, m.Err(), "make room")
	}
	resp, err := op.Get(ctx, ms[2].Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	before := cnt.Counts()
	_, err = op.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	revoked := time.Now()
	for _, m := range ms[2:] {
		etcdtest.Within(t, m.Done(), 30*time.Second, "a hold of the revoked lease")
		assert.ErrorIs(t, m.Err(), core.ErrLost)
		assert.NotErrorIs(t, m.Err(), core.ErrReleasedByOperator)
	}
	t.Logf("%d holds told %v after the revoke", n-2, time.Since(revoked))
	sent := cnt.Counts().Sub(before)
	reads := sent["Range"] + sent["Txn"] + sent["LeaseTimeToLive"]
	assert.LessOrEqual(t, reads, int64(20), "reads after the lease ended, for %d holds: %v", n-2, sent)
}
