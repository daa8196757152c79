package election_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

func TestObserveSeesEveryValueInOrderAndTheHandover(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, proclaims = "observe-all", 40
	admin := cluster.Client(t)
	watcher := newElection(t, cluster.Client(t), name)
	octx, stop := context.WithCancel(ctx)
	obs := watcher.Observe(octx)
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs), "no leader yet")

	first := newElection(t, cluster.Client(t), name)
	second := newElection(t, cluster.Client(t), name)
	require.NoError(t, first.Campaign(ctx, "first-0"))
	waiting := campaignAsync(ctx, second, "second")
	primtest.AwaitKeys(t, admin, name, 2)

	// The reader keeps up; the proclaims are as fast as etcd takes them, so several may
	// come in one watch response.
	got := make(chan []election.Leader, 1)
	go func() {
		var seen []election.Leader
		for len(seen) < proclaims+3 {
			l, ok := <-obs
			if !ok {
				break
			}
			seen = append(seen, l)
		}
		got <- seen
	}()
	var want []election.Leader
	want = append(want, election.Leader{Value: "first-0", Token: first.Token()})
	for i := 1; i <= proclaims; i++ {
		v := fmt.Sprintf("first-%d", i)
		require.NoError(t, first.Proclaim(ctx, v))
		want = append(want, election.Leader{Value: v, Token: first.Token()})
	}
	require.NoError(t, first.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, waiting, 10*time.Second, "the second candidate leads"))
	want = append(want, election.Leader{Value: "second", Token: second.Token()})
	require.NoError(t, second.Resign(ctx))
	want = append(want, election.Leader{})

	assert.Equal(t, want, etcdtest.Within(t, got, 20*time.Second, "Observe sends every change"))
	stop()
	_, ok := <-obs
	assert.False(t, ok, "Observe's channel stays open after ctx ended")
}

func TestObserveStartsWithTheCurrentLeaderAndSendsNoRepeats(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "observe-current"
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "v1"))
	obs := newElection(t, cluster.Client(t), name).Observe(ctx)
	assert.Equal(t, election.Leader{Value: "v1", Token: leader.Token()}, primtest.NextLeader(t, obs))

	// Proclaiming the same value changes nothing an observer sees.
	require.NoError(t, leader.Proclaim(ctx, "v1"))
	require.NoError(t, leader.Proclaim(ctx, "v2"))
	assert.Equal(t, election.Leader{Value: "v2", Token: leader.Token()}, primtest.NextLeader(t, obs))
	require.NoError(t, leader.Resign(ctx))
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))
}

// TestObserveCoalescesForASlowReader proclaims more values than an observer queues while
// its reader does not read: the reader then gets a suffix of them, in order, ending with
// the latest.
func TestObserveCoalescesForASlowReader(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, proclaims = "observe-slow", 300
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "0"))
	obs := newElection(t, cluster.Client(t), name).Observe(ctx)
	assert.Equal(t, election.Leader{Value: "0", Token: leader.Token()}, primtest.NextLeader(t, obs))
	for i := 1; i <= proclaims; i++ {
		require.NoError(t, leader.Proclaim(ctx, fmt.Sprint(i)))
	}
	last := 0
	for last != proclaims {
		l := primtest.NextLeader(t, obs)
		var n int
		_, err := fmt.Sscan(l.Value, &n)
		require.NoError(t, err)
		require.Greater(t, n, last, "out of order or repeated")
		last = n
	}
	require.NoError(t, leader.Resign(ctx))
	assert.Equal(t, election.Leader{}, primtest.NextLeader(t, obs))
}

// TestObserversOfOneClientShareItsWatch: one watch and one read for all the observers of a
// client, however many there are. It counts the requests on the name's keys, not the reads
// of the cluster's clock that a client of observers sends every few seconds.
func TestObserversOfOneClientShareItsWatch(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "observe-shared"
	cnt := &rpcstat.Counter{}
	cli := primtest.CountedClient(t, cluster, cnt)
	onName := cluster.Prefix() + core.NamePrefix(name)
	cnt.Track(onName)
	leader := newElection(t, cluster.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "a"))
	var chans []<-chan election.Leader
	for range 5 {
		chans = append(chans, newElection(t, cli, name).Observe(ctx))
	}
	for _, obs := range chans {
		assert.Equal(t, "a", primtest.NextLeader(t, obs).Value)
	}
	require.NoError(t, leader.Proclaim(ctx, "b"))
	for _, obs := range chans {
		assert.Equal(t, "b", primtest.NextLeader(t, obs).Value)
	}
	counts := cnt.Under(onName)
	assert.Equal(t, int64(1), counts["Watch.send"], "watches created for %d observers", len(chans))
	assert.LessOrEqual(t, counts["Range"], int64(2), "reads for %d observers", len(chans))
	require.NoError(t, leader.Resign(ctx))
}
