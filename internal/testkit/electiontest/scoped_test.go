package election_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// stopTime is how long a lead takes to stop once its ctx has ended: long enough for another
// Run of the handle to win meanwhile, were it allowed to.
const stopTime = 300 * time.Millisecond

// A term is what a lead reports as it starts: its key and token.
type term struct {
	key   string
	token int64
}

// TestTwoRunsOnOneHandleNeverLeadTogether: two Runs on one handle, whose lead takes a while
// to stop; an operator deletes the leader's key, round after round. The other Run never
// leads while a lead of the handle still runs, and each new lead has its key, which the
// other Run's resign leaves alone.
func TestTwoRunsOnOneHandleNeverLeadTogether(t *testing.T) {
	const name, rounds = "run-two", 4
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	var leading atomic.Int64
	started := make(chan term, 2)
	lead := func(lctx context.Context) error {
		if n := leading.Add(1); n != 1 {
			t.Errorf("%d leads of one handle run at once", n)
		}
		defer leading.Add(-1)
		started <- term{key: e.Key(), token: e.Token()}
		<-lctx.Done()
		time.Sleep(stopTime) // the lead's own shutdown: the point of the test
		return nil
	}
	runs := []<-chan error{
		etcdtest.Async(func() error { return e.Run(ctx, "a", lead) }),
		etcdtest.Async(func() error { return e.Run(ctx, "b", lead) }),
	}
	for range rounds {
		tm := etcdtest.Within(t, started, 20*time.Second, "a lead")
		require.NotEmpty(t, tm.key)
		// Fenced on the term's token: a key the other Run resigned meanwhile is no longer
		// there to delete.
		resp, err := admin.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(tm.key), "=", tm.token)).
			Then(clientv3.OpDelete(tm.key)).Commit()
		require.NoError(t, err)
		assert.True(t, resp.Succeeded, "a running lead's key was gone")
	}
	cancel()
	for _, errc := range runs {
		assert.ErrorIs(t, etcdtest.Within(t, errc, 20*time.Second, "a Run's return"), context.Canceled)
	}
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 0)
}

// TestCampaignBesideRunWaitsForLeadToReturn: a Run leads on a handle, a Campaign on the same
// handle waits; the Run's leadership is lost: the Campaign wins only once lead has returned,
// and Run's resign then leaves the Campaign's leadership alone.
func TestCampaignBesideRunWaitsForLeadToReturn(t *testing.T) {
	const name = "run-campaign"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name)
	started := make(chan term, 1)
	var returned atomic.Bool
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	errc := etcdtest.Async(func() error {
		return e.Run(runCtx, "run", func(lctx context.Context) error {
			select {
			case started <- term{key: e.Key(), token: e.Token()}:
			default:
			}
			<-lctx.Done()
			time.Sleep(stopTime)
			returned.Store(true)
			return nil
		})
	})
	tm := etcdtest.Within(t, started, 20*time.Second, "Run's lead")
	campaigned := etcdtest.Async(func() error { return e.Campaign(ctx, "campaign") })
	_, err := admin.Delete(ctx, tm.key)
	require.NoError(t, err)
	require.NoError(t, etcdtest.Within(t, campaigned, 20*time.Second, "the Campaign"))
	assert.True(t, returned.Load(), "the Campaign led while Run's lead still ran")
	token := e.Token()
	stopRun() // Run waits for the Campaign's leadership, and returns
	assert.ErrorIs(t, etcdtest.Within(t, errc, 20*time.Second, "Run's return"), context.Canceled)
	assert.NoError(t, e.Err(), "Run's resign ended the Campaign's leadership")
	assert.Equal(t, token, e.Token())
	require.NoError(t, e.Resign(ctx))
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 0)
}

// hangingCheck is a health check that passes until hang is closed, then blocks until release
// is closed, honouring its ctx or not; hung yields once it blocks.
type hangingCheck struct {
	honoursCtx bool
	hang       chan struct{}
	release    chan struct{}
	hung       chan struct{}
	once       atomic.Bool
}

func newHangingCheck(t *testing.T, honoursCtx bool) *hangingCheck {
	c := &hangingCheck{honoursCtx: honoursCtx, hang: make(chan struct{}), release: make(chan struct{}), hung: make(chan struct{})}
	t.Cleanup(func() { close(c.release) }) // before goleak: an abandoned check returns
	return c
}

func (c *hangingCheck) check(ctx context.Context) error {
	select {
	case <-c.hang:
	default:
		return nil
	}
	if c.once.CompareAndSwap(false, true) {
		close(c.hung)
	}
	if c.honoursCtx {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.release:
			return nil
		}
	}
	<-c.release
	return nil
}

// TestHealthCheckThatHangsIsAFailure: a check that has not returned within its period has
// failed, whether it honours its ctx (which has that deadline) or ignores it: lead's ctx
// ends, and another candidate can lead.
func TestHealthCheckThatHangsIsAFailure(t *testing.T) {
	for _, tc := range []struct {
		name       string
		honoursCtx bool
	}{{"honours-ctx", true}, {"ignores-ctx", false}} {
		t.Run(tc.name, func(t *testing.T) {
			name := "run-hang-" + tc.name
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := newHangingCheck(t, tc.honoursCtx)
			e := newElection(t, cluster.Client(t), name)
			ended := make(chan error, 1)
			leading := make(chan struct{})
			var once atomic.Bool
			errc := etcdtest.Async(func() error {
				return e.Run(ctx, "v", func(lctx context.Context) error {
					if !once.CompareAndSwap(false, true) {
						t.Error("Run led again while its check hung")
						return nil
					}
					close(leading)
					<-lctx.Done()
					ended <- context.Cause(lctx)
					return nil // Run resigns, and campaigns again only once the check passes
				}, election.WithHealthCheck(200*time.Millisecond, c.check))
			})
			etcdtest.Within(t, leading, 20*time.Second, "the term")
			close(c.hang)
			cause := etcdtest.Within(t, ended, 20*time.Second, "the end of lead's ctx after a hung check")
			assert.Error(t, cause)
			assert.NotErrorIs(t, cause, context.Canceled, "lead's ctx ended with Run's, not on the check")
			other := newElection(t, cluster.Client(t), name)
			require.NoError(t, other.Campaign(ctx, "other"), "another candidate could not lead")
			require.NoError(t, other.Resign(ctx))
			cancel()
			assert.ErrorIs(t, etcdtest.Within(t, errc, 20*time.Second, "Run's return"), context.Canceled)
		})
	}
}

// TestStoppedRunReturnsWhateverItsCheckDoes: Run's ctx ends while a check hangs, ignoring
// its ctx, both while Run leads and while it waits for the check to pass: Run returns within
// a bound, and its key is gone.
func TestStoppedRunReturnsWhateverItsCheckDoes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leads bool // the check hangs once Run leads, else from the start
	}{{"leading", true}, {"waiting", false}} {
		t.Run(tc.name, func(t *testing.T) {
			name, leads := "run-stop-"+tc.name, tc.leads
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			admin := cluster.Client(t)
			c := newHangingCheck(t, false)
			if !leads {
				close(c.hang)
			}
			e := newElection(t, cluster.Client(t), name)
			leading := make(chan struct{})
			errc := etcdtest.Async(func() error {
				return e.Run(ctx, "v", func(lctx context.Context) error {
					close(leading)
					<-lctx.Done()
					return nil
				}, election.WithHealthCheck(time.Second, c.check))
			})
			if leads {
				etcdtest.Within(t, leading, 20*time.Second, "the term")
				close(c.hang)
			}
			etcdtest.Within(t, c.hung, 20*time.Second, "the check's hang")
			cancel()
			err := etcdtest.Within(t, errc, 10*time.Second, "Run's return while its check hangs")
			assert.ErrorIs(t, err, context.Canceled)
			assert.Zero(t, etcdtest.CountKeys(t, admin, core.NamePrefix(name)), "Run left its key")
		})
	}
}
