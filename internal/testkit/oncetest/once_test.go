package once_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	adminpkg "github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/once"
)

// newJob returns a Job of name with period over cli, whose record an earlier run (-count)
// left is deleted first.
func newJob(t *testing.T, cli *clientv3.Client, name string, period time.Duration) *once.Job {
	t.Helper()
	j, err := once.New(cli, name, period)
	require.NoError(t, err)
	require.NoError(t, j.Delete(etcdtest.Context(t)))
	return j
}

// recordKey is the key of name's record.
func recordKey(name string) string { return core.OnceRecordKey(core.NamePrefix(name)) }

// TestThreeHostsRunOncePerPeriod: three clients run one job of a 1 s period in a loop, as
// cron on three hosts would, through several periods: every period that had a run had
// exactly one, and each run's record is the period it ran for.
func TestThreeHostsRunOncePerPeriod(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "once-three-hosts"
	const periods = 4
	jobs := []*once.Job{newJob(t, cluster.Client(t), name, time.Second)}
	for range 2 {
		j, err := once.New(cluster.Client(t), name, time.Second)
		require.NoError(t, err)
		jobs = append(jobs, j)
	}
	var mu sync.Mutex
	runs := map[time.Time]int{}
	end := time.Now().Truncate(time.Second).Add(periods * time.Second)
	var hosts sync.WaitGroup
	errs := make(chan error, len(jobs))
	for _, j := range jobs {
		hosts.Go(func() {
			for time.Now().Before(end) {
				_, err := j.Run(ctx, func(ctx context.Context) error {
					mu.Lock()
					runs[once.Start(ctx)]++
					mu.Unlock()
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				time.Sleep(20 * time.Millisecond) // the next cron tick: the workload, not a wait for an event
			}
		})
	}
	hosts.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, len(runs), periods-1, "periods with a run: %v", runs)
	var latest time.Time
	for start, n := range runs {
		assert.Equal(t, 1, n, "runs in the period of %v", start)
		assert.Zero(t, start.UnixNano()%int64(time.Second), "a period starts on a whole second: %v", start)
		if start.After(latest) {
			latest = start
		}
	}
	last, err := jobs[0].Last(ctx)
	require.NoError(t, err)
	assert.True(t, last.Start.Equal(latest), "the record says %v, the last run was for %v", last.Start, latest)
	assert.Equal(t, time.Second, last.Period)
	assert.Positive(t, last.Token)
	assert.Contains(t, last.Owner, "host=")
	require.NoError(t, jobs[0].Delete(ctx))
}

// TestAFailedRunRecordsNothing: a fn that fails records nothing, so the next Run in the
// period runs it again; once it succeeds, the period is done.
func TestAFailedRunRecordsNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "once-failed"
	j := newJob(t, cluster.Client(t), name, time.Hour)
	boom := errors.New("boom")
	ran, err := j.Run(ctx, func(context.Context) error { return boom })
	assert.True(t, ran)
	require.ErrorIs(t, err, boom)
	last, err := j.Last(ctx)
	require.NoError(t, err)
	assert.True(t, last.Start.IsZero(), "a failed run recorded %+v", last)

	ran, err = j.Run(ctx, func(context.Context) error { return nil })
	require.NoError(t, err)
	assert.True(t, ran, "the run after a failure did not run")
	ran, err = j.Run(ctx, func(context.Context) error { t.Error("ran twice in one period"); return nil })
	require.NoError(t, err)
	assert.False(t, ran)
	require.NoError(t, j.Delete(ctx))
}

// TestAHoldLostMidRunIsNotRecorded: the hold's key deleted while fn runs ends fn's ctx; fn
// returns nil all the same, and Run says ErrLost with nothing recorded: the next Run runs.
func TestAHoldLostMidRunIsNotRecorded(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "once-lost"
	admin := cluster.Client(t)
	j := newJob(t, cluster.Client(t), name, time.Hour)
	started := make(chan struct{})
	done := etcdtest.Async(func() error {
		_, err := j.Run(ctx, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return nil // as a job that does not check its ctx would
		})
		return err
	})
	etcdtest.Within(t, started, 10*time.Second, "fn's start")
	_, err := admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix()) // an operator's delete of the hold's key
	require.NoError(t, err)
	require.ErrorIs(t, etcdtest.Within(t, done, 20*time.Second, "the Run whose hold was lost"), once.ErrLost)
	resp, err := admin.Get(ctx, recordKey(name))
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "a lost run was recorded")

	ran, err := j.Run(ctx, func(context.Context) error { return nil })
	require.NoError(t, err)
	assert.True(t, ran)
	require.NoError(t, j.Delete(ctx))
}

// TestARecordOfALaterPeriodSkips: the record only moves forward: a Run whose clock says an
// earlier period than the one recorded (a host whose clock lags) runs nothing and writes
// nothing.
func TestARecordOfALaterPeriodSkips(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "once-later"
	admin := cluster.Client(t)
	j := newJob(t, cluster.Client(t), name, time.Hour)
	later := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
	value := fmt.Sprintf(`{"start":%q,"period":"1h0m0s","at":%q,"token":1,"owner":"host=elsewhere"}`,
		later.Format(time.RFC3339), later.Format(time.RFC3339))
	put, err := admin.Put(ctx, recordKey(name), value)
	require.NoError(t, err)
	ran, err := j.Run(ctx, func(context.Context) error { t.Error("ran in a period before the one recorded"); return nil })
	require.NoError(t, err)
	assert.False(t, ran)
	resp, err := admin.Get(ctx, recordKey(name))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	assert.Equal(t, value, string(resp.Kvs[0].Value))
	// Not written again: the record is the put above (the lock's own keys come and go).
	assert.Equal(t, put.Header.Revision, resp.Kvs[0].ModRevision, "the record was written again")
	require.NoError(t, j.Delete(ctx))
}

// TestBadInputWritesNothing: a period under a second, a nil fn, a nil client, a bad name, an
// option a lock does not take, a Job New did not make: ErrInvalidOption (ErrInvalidName),
// and nothing written.
func TestBadInputWritesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, admin)
	_, err := once.New(cli, "once-bad", 999*time.Millisecond)
	require.ErrorIs(t, err, once.ErrInvalidOption)
	_, err = once.New(nil, "once-bad", time.Hour)
	require.ErrorIs(t, err, once.ErrInvalidOption)
	_, err = once.New(cli, "", time.Hour)
	require.ErrorIs(t, err, once.ErrInvalidName)
	_, err = once.New(cli, "once-bad", time.Hour, election.WithPreference(3))
	require.ErrorIs(t, err, once.ErrInvalidOption)
	j, err := once.New(cli, "once-bad", time.Hour)
	require.NoError(t, err)
	ran, err := j.Run(ctx, nil)
	require.ErrorIs(t, err, once.ErrInvalidOption)
	assert.False(t, ran)
	var zero once.Job
	ran, err = zero.Run(ctx, func(context.Context) error { t.Error("a zero Job ran"); return nil })
	require.ErrorIs(t, err, once.ErrInvalidOption)
	assert.False(t, ran)
	_, err = (*once.Job)(nil).Last(ctx)
	require.ErrorIs(t, err, once.ErrInvalidOption)
	require.ErrorIs(t, (*once.Job)(nil).Delete(ctx), once.ErrInvalidOption)
	etcdtest.NoWrites(t, admin, before, "bad input wrote")
}

// TestDueAndCompleteUnderTheCallersHold: a caller that takes the Job's lock its own way
// (the command does) asks Due, records with Complete, and finds the period done after; a
// Complete without the hold is ErrNotLocked and writes nothing.
func TestDueAndCompleteUnderTheCallersHold(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "once-parts"
	admin := cluster.Client(t)
	j := newJob(t, cluster.Client(t), name, time.Hour)
	m := j.Mutex()
	require.NoError(t, m.Lock(ctx))
	p, due, err := j.Due(ctx)
	require.NoError(t, err)
	assert.True(t, due)
	assert.True(t, p.Start.Equal(time.Now().UTC().Truncate(time.Hour)) || p.Start.Equal(time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)))
	require.NoError(t, j.Complete(ctx, p))
	_, due, err = j.Due(ctx)
	require.NoError(t, err)
	assert.False(t, due, "a period completed is still due")
	require.NoError(t, m.Unlock(ctx))

	before := etcdtest.Revision(t, admin)
	require.ErrorIs(t, j.Complete(ctx, p), once.ErrNotLocked)
	etcdtest.NoWrites(t, admin, before, "a Complete without the hold wrote")
	last, err := j.Last(ctx)
	require.NoError(t, err)
	assert.True(t, last.Start.Equal(p.Start))
	require.NoError(t, j.Delete(ctx))
}

// TestAdminDeleteRemovesTheRecord: admin.Delete (etcdsync delete) removes a job's record
// once nobody holds the name, and refuses while a run holds it, deleting nothing.
func TestAdminDeleteRemovesTheRecord(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "once-delete"
	admin := cluster.Client(t)
	j := newJob(t, cluster.Client(t), name, time.Hour)
	ran, err := j.Run(ctx, func(ctx context.Context) error {
		require.ErrorIs(t, adminpkg.Delete(ctx, admin, []string{name}), adminpkg.ErrInUse)
		return nil
	})
	require.NoError(t, err)
	require.True(t, ran)
	last, err := j.Last(ctx)
	require.NoError(t, err)
	require.False(t, last.Start.IsZero(), "a run was not recorded, or a Delete while it ran removed the record")
	require.NoError(t, adminpkg.Delete(ctx, admin, []string{name}))
	last, err = j.Last(ctx)
	require.NoError(t, err)
	assert.True(t, last.Start.IsZero(), "the record outlived admin.Delete: %+v", last)
}
