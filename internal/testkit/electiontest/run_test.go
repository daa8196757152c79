package election_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestRunLoopsNeverLeadAtOnceAndRotate: three Run loops on one name, on three clients
// spread over the members of a 3-member cluster, whose lead returns nil after a moment:
// never two in lead at once, every loop leads in turn, and once ctx ends every Run returns
// ctx's error and no key is left.
func TestRunLoopsNeverLeadAtOnceAndRotate(t *testing.T) {
	c := etcdtest.LaggingCluster(t)
	const name, loops, terms = "run-rotate", 3, 12
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var leading, total atomic.Int64
	led := make([]atomic.Int64, loops)
	var wg sync.WaitGroup
	errs := make([]error, loops)
	for i := range loops {
		e := newElection(t, etcdtest.SpreadClient(t, c, i), name)
		wg.Go(func() {
			errs[i] = e.Run(ctx, "loop", func(lctx context.Context) error {
				if n := leading.Add(1); n != 1 {
					t.Errorf("%d loops lead at once", n)
				}
				led[i].Add(1)
				time.Sleep(20 * time.Millisecond) // the work of a term
				leading.Add(-1)
				if total.Add(1) == terms {
					cancel()
				}
				return nil
			})
		})
	}
	wg.Wait()
	for i := range loops {
		assert.ErrorIs(t, errs[i], context.Canceled)
		assert.Positive(t, led[i].Load(), "loop %d never led", i)
	}
	etcdtest.AwaitKeys(t, c.Client(t), core.NamePrefix(name), 0)
}

// TestRunCampaignsAgainAfterALoss: the leader's key is deleted by an operator, then its
// lease revoked: each time lead's ctx ends with a cause matching ErrLost, and Run campaigns
// again and leads a new term.
func TestRunCampaignsAgainAfterALoss(t *testing.T) {
	const name = "run-loss"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := cluster.Client(t)
	e := newElection(t, cluster.Client(t), name, election.WithTTL(5*time.Second))
	terms := make(chan int64, 3)
	var causes []error
	errc := etcdtest.Async(func() error {
		return e.Run(ctx, "v", func(lctx context.Context) error {
			terms <- e.Token()
			<-lctx.Done()
			causes = append(causes, context.Cause(lctx))
			if len(causes) == 3 {
				cancel()
			}
			return lctx.Err()
		})
	})
	first := etcdtest.Within(t, terms, 20*time.Second, "the first term")
	_, err := admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	second := etcdtest.Within(t, terms, 20*time.Second, "a term after the key was deleted")
	assert.Greater(t, second, first)
	_, err = admin.Revoke(ctx, leaderLease(t, admin, name))
	require.NoError(t, err)
	third := etcdtest.Within(t, terms, 20*time.Second, "a term after the lease was revoked")
	assert.Greater(t, third, second)
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, errc, 20*time.Second, "Run's return"), context.Canceled)
	require.GreaterOrEqual(t, len(causes), 2)
	for _, c := range causes[:2] {
		assert.ErrorIs(t, c, core.ErrLost)
	}
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 0)
}

// TestRunStopsOnLeadsError: lead returns an error while leading: Run resigns and returns it.
func TestRunStopsOnLeadsError(t *testing.T) {
	const name = "run-error"
	errBroken := errors.New("broken")
	e := newElection(t, cluster.Client(t), name)
	terms := 0
	err := e.Run(etcdtest.Context(t), "v", func(context.Context) error {
		terms++
		return errBroken
	})
	assert.ErrorIs(t, err, errBroken)
	assert.Equal(t, 1, terms)
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), core.NamePrefix(name)), "Run did not resign")
}

// TestRunStepsDownOnAFailedHealthCheck: the first failed check ends lead's ctx with the
// check's error as its cause; Run resigns at once (another candidate leads) and campaigns
// again only once the check passes. Once Run has returned and its clients are closed, no
// key and no goroutine (of a term, of its check) is left.
func TestRunStepsDownOnAFailedHealthCheck(t *testing.T) {
	const name = "run-health"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ignore := goleak.IgnoreCurrent()
	cli, otherCli, admin := cluster.Client(t), cluster.Client(t), cluster.Client(t)
	errSick := errors.New("sick")
	var sick atomic.Bool
	check := func(context.Context) error {
		if sick.Load() {
			return errSick
		}
		return nil
	}
	e := newElection(t, cli, name)
	terms := make(chan context.Context, 2)
	ended := make(chan error, 2)
	errc := etcdtest.Async(func() error {
		return e.Run(ctx, "v", func(lctx context.Context) error {
			terms <- lctx
			<-lctx.Done()
			ended <- context.Cause(lctx)
			return nil
		}, election.WithHealthCheck(20*time.Millisecond, check))
	})
	etcdtest.Within(t, terms, 20*time.Second, "the first term")
	sick.Store(true)
	assert.ErrorIs(t, etcdtest.Within(t, ended, 20*time.Second, "the end of the sick term"), errSick)
	other := newElection(t, otherCli, name)
	require.NoError(t, other.Campaign(ctx, "other"), "another candidate could not lead once the sick leader stepped down")
	require.NoError(t, other.Resign(ctx))
	select {
	case <-terms:
		t.Fatal("Run campaigned again while its check failed")
	case <-time.After(200 * time.Millisecond):
	}
	sick.Store(false)
	etcdtest.Within(t, terms, 20*time.Second, "a term once the check passed")
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, errc, 20*time.Second, "Run's return"), context.Canceled)
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 0)
	for _, c := range []*clientv3.Client{cli, otherCli, admin} {
		require.NoError(t, c.Close())
	}
	etcdtest.NoNewGoroutines(t, ignore)
}

// TestRunRefusesBadInput: a nil lead or a bad health check is ErrInvalidOption, and Run
// campaigns for nothing.
func TestRunRefusesBadInput(t *testing.T) {
	cli := cluster.Client(t)
	before := etcdtest.Revision(t, cli)
	e := newElection(t, cli, "run-bad")
	ctx := etcdtest.Context(t)
	lead := func(context.Context) error { return nil }
	assert.ErrorIs(t, e.Run(ctx, "v", nil), election.ErrInvalidOption)
	assert.ErrorIs(t, e.Run(ctx, "v", lead, election.WithHealthCheck(0, func(context.Context) error { return nil })), election.ErrInvalidOption)
	assert.ErrorIs(t, e.Run(ctx, "v", lead, election.WithHealthCheck(time.Second, nil)), election.ErrInvalidOption)
	var zero election.Election
	assert.ErrorIs(t, zero.Run(ctx, "v", lead), election.ErrInvalidOption)
	etcdtest.NoWrites(t, cli, before, "a refused Run wrote to etcd")
}

// TestACutOffLeadersLeadEndsBeforeAnotherLeads: the leader's client is black-holed (etcd's
// proxy drops its traffic) while another Run waits. The other comes to lead only once the
// leader's lease expires in etcd; by then the cut-off leader's lead ctx must have ended
// (the local deadline precedes the expiry), in every run. The lead is logged.
func TestACutOffLeadersLeadEndsBeforeAnotherLeads(t *testing.T) {
	runs := 3
	if testing.Short() {
		runs = 1
	}
	for i := range runs {
		const ttl = 2 * time.Second
		name := "run-cut-off-" + strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cli, proxy := etcdtest.ProxiedClient(t, cluster, 0)
		cut := newElection(t, cli, name, election.WithTTL(ttl))
		start := time.Now()
		var ended atomic.Int64 // when the cut-off leader's lead ctx ended, in ns since start
		leading := make(chan struct{})
		cutErr := etcdtest.Async(func() error {
			return cut.Run(ctx, "cut", func(lctx context.Context) error {
				close(leading)
				<-lctx.Done()
				ended.Store(int64(time.Since(start)))
				<-ctx.Done() // stay out of the way: one term is enough
				return nil
			})
		})
		etcdtest.Within(t, leading, 20*time.Second, "the first leader")
		type term struct {
			at       time.Duration
			endedYet bool
		}
		terms := make(chan term, 1)
		other := newElection(t, cluster.Client(t), name, election.WithTTL(ttl))
		otherErr := etcdtest.Async(func() error {
			return other.Run(ctx, "other", func(lctx context.Context) error {
				terms <- term{at: time.Since(start), endedYet: ended.Load() != 0}
				<-lctx.Done()
				return nil
			})
		})
		primtest.AwaitKeys(t, cluster.Client(t), name, 2)
		proxy.Blackhole()
		got := etcdtest.Within(t, terms, ttl+30*time.Second, "the other's term")
		require.True(t, got.endedYet, "the other led while the cut-off leader's lead ctx was still open")
		t.Logf("run %d: the cut-off leader's lead ended %v before the other led", i, got.at-time.Duration(ended.Load()))
		proxy.Restore()
		cancel()
		assert.ErrorIs(t, etcdtest.Within(t, cutErr, 20*time.Second, "the cut-off Run"), context.Canceled)
		assert.ErrorIs(t, etcdtest.Within(t, otherErr, 20*time.Second, "the other Run"), context.Canceled)
	}
}

// TestRunCampaignsAgainAfterItsMemberIsPartitioned: a 3-member cluster; the leading Run is
// on a client of a follower that is then cut off from its peers, the other Run and the
// watch of the name on clients of the other members. The cut-off leader's lead ctx ends
// (ErrLost) at its session's local deadline, before etcd deletes its key on the lease's
// expiry and the other is elected; once healed, the cut-off Run campaigns again and leads
// the term after the other's. The timestamps are logged.
func TestRunCampaignsAgainAfterItsMemberIsPartitioned(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, err := etcdtest.NewEmbedded(3, etcdtest.WithPeerProxies())
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	raftLeader, err := c.Leader(ctx)
	require.NoError(t, err)
	cutMember, otherMember := (raftLeader+1)%3, (raftLeader+2)%3
	const name, ttl = "run-partitioned", 2 * time.Second
	start := time.Now()

	type term struct {
		token int64
		key   string
		at    time.Duration // since start, when lead was called
		ended time.Duration // when its ctx ended
		cause error
	}
	cut := newElection(t, etcdtest.PinnedClient(t, c, cutMember), name, election.WithTTL(ttl))
	cutTerms, cutEnded := make(chan term, 2), make(chan term, 2)
	cutErr := etcdtest.Async(func() error {
		return cut.Run(ctx, "cut", func(lctx context.Context) error {
			tm := term{token: cut.Token(), key: cut.Key(), at: time.Since(start)}
			cutTerms <- tm
			<-lctx.Done()
			tm.ended, tm.cause = time.Since(start), context.Cause(lctx)
			cutEnded <- tm
			return nil
		})
	})
	first := etcdtest.Within(t, cutTerms, 20*time.Second, "the first term, on the member to be cut off")

	other := newElection(t, etcdtest.PinnedClient(t, c, otherMember), name, election.WithTTL(ttl))
	otherTerms := make(chan term, 2)
	stepDown := make(chan struct{})
	otherErr := etcdtest.Async(func() error {
		return other.Run(ctx, "other", func(lctx context.Context) error {
			otherTerms <- term{token: other.Token(), at: time.Since(start)}
			select {
			case <-stepDown:
			case <-lctx.Done():
			}
			return nil
		})
	})
	admin := etcdtest.PinnedClient(t, c, raftLeader)
	primtest.AwaitKeys(t, admin, name, 2)
	// The moment etcd deletes the cut-off leader's key, as a client of the raft leader sees
	// it (a delete event carries the key and its mod revision only).
	deleted := make(chan time.Duration, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := admin.Watch(wctx, core.NamePrefix(name), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	go func() {
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete && string(ev.Kv.Key) == first.key {
					deleted <- time.Since(start)
					return
				}
			}
		}
	}()

	partitioned := time.Since(start)
	c.Partition(cutMember)
	lost := etcdtest.Within(t, cutEnded, ttl+20*time.Second, "the end of the cut-off leader's term")
	gone := etcdtest.Within(t, deleted, ttl+20*time.Second, "the deletion of the cut-off leader's key")
	second := etcdtest.Within(t, otherTerms, 20*time.Second, "the other's term")
	t.Logf("partitioned at %v; the cut-off leader's lead ctx ended at %v (%v); its key deleted at %v; the other led at %v",
		partitioned, lost.ended, lost.cause, gone, second.at)
	assert.ErrorIs(t, lost.cause, core.ErrLost)
	require.Less(t, lost.ended, gone, "the cut-off leader's lead ctx was still open when etcd deleted its key")
	require.Less(t, lost.ended, second.at, "the other led while the cut-off leader's lead ctx was still open")
	assert.Greater(t, second.token, first.token)

	c.Heal(cutMember)
	primtest.AwaitKeys(t, admin, name, 2) // the cut-off Run campaigns again, behind the other
	etcdtest.Pending(t, cutErr, "the cut-off Run")
	close(stepDown)
	third := etcdtest.Within(t, cutTerms, 30*time.Second, "a term of the cut-off Run once healed")
	assert.Greater(t, third.token, second.token)
	t.Logf("healed; the cut-off Run led again at %v", third.at)
	cancel()
	assert.ErrorIs(t, etcdtest.Within(t, cutErr, 20*time.Second, "the cut-off Run"), context.Canceled)
	assert.ErrorIs(t, etcdtest.Within(t, otherErr, 20*time.Second, "the other Run"), context.Canceled)
	etcdtest.AwaitKeys(t, admin, core.NamePrefix(name), 0)
}

// TestRunCampaignsAgainAfterAResignWithoutAnswer: lead returns nil and the resign's delete
// gets no answer (lost once on the way back): Run does not stop, since lead's error alone
// stops it; the resign finishes in the background and the loop leads again, with a higher
// token, until ctx ends, leaving no key.
func TestRunCampaignsAgainAfterAResignWithoutAnswer(t *testing.T) {
	const name = "run-resign-unanswered"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inj := &etcdtest.Injector{}
	e := newElection(t, inj.Client(t, cluster), name)
	terms := make(chan int64, 2)
	errc := etcdtest.Async(func() error {
		return e.Run(ctx, "v", func(context.Context) error {
			select {
			case terms <- e.Token():
			default:
			}
			// This term's resign is sent but its answer is lost: the release is retried in
			// the background.
			inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.NamePrefix(name)), Action: etcdtest.Lose, Times: 1})
			return nil
		})
	})
	first := etcdtest.Within(t, terms, 30*time.Second, "the first term")
	select {
	case second := <-terms:
		assert.Greater(t, second, first, "the second term's token")
	case err := <-errc:
		t.Fatalf("Run returned %v after a resign without an answer, with ctx alive", err)
	case <-time.After(time.Minute):
		t.Fatal("no second term within a minute")
	}
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	inj.Clear()
	etcdtest.AwaitKeys(t, cluster.Client(t), core.NamePrefix(name), 0)
}
