package realbench

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// TestSpreadPinsClientsToMembersInTurn: client i has member i modulo the size as its only
// endpoint.
func TestSpreadPinsClientsToMembersInTurn(t *testing.T) {
	members := []string{"m0", "m1", "m2"}
	assert.Equal(t, [][]string{{"m0"}, {"m1"}, {"m2"}, {"m0"}, {"m1"}}, spread(members, 5))
	assert.Equal(t, [][]string{{"m0"}, {"m0"}}, spread(members[:1], 2))
}

// TestRoundsAlternateWhoGoesFirst: ours runs first in odd rounds and the rival in even ones,
// the commit sides after both; every round's tally lands with its side, in round order.
func TestRoundsAlternateWhoGoesFirst(t *testing.T) {
	var ran []string
	fake := func(name string) side {
		return side{name: name, run: func(_ context.Context, d time.Duration) (tally, error) {
			ran = append(ran, name)
			return tally{d, []count{{op: "cycle", within: int64(len(ran)), all: int64(len(ran))}}, nil}, nil
		}}
	}
	c := comparison{ours: fake("ours"), rival: fake("etcd"), commits: []side{fake("leader"), fake("follower")}}
	res, err := runRounds(context.Background(), c, 3, time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"ours", "etcd", "leader", "follower",
		"etcd", "ours", "leader", "follower",
		"ours", "etcd", "leader", "follower",
	}, ran)
	assert.Equal(t, []float64{1, 6, 9}, rates(res["ours"], 0))
	assert.Equal(t, []float64{2, 5, 10}, rates(res["etcd"], 0))
	assert.Equal(t, []float64{4, 8, 12}, rates(res["follower"], 0))
	assert.Equal(t, []float64{0.5, 1.2, 0.9}, ratios(res["ours"], res["etcd"]))
}

// TestRoundsStopAtAFailure: a side's error ends the rounds and names the round and side.
func TestRoundsStopAtAFailure(t *testing.T) {
	broken := errors.New("broken")
	runs := 0
	ok := side{name: "ours", run: func(context.Context, time.Duration) (tally, error) { runs++; return tally{}, nil }}
	bad := side{name: "etcd", run: func(context.Context, time.Duration) (tally, error) { runs++; return tally{}, broken }}
	_, err := runRounds(context.Background(), comparison{ours: ok, rival: bad}, 3, time.Second)
	require.ErrorIs(t, err, broken)
	assert.ErrorContains(t, err, "round 1, etcd")
	assert.Equal(t, 2, runs)
}

// TestLoopCountsRunsWithinTheWindowAndAfter: every worker stops at its first run ending
// after the window; runs that ended after it count in all but not within.
func TestLoopCountsRunsWithinTheWindowAndAfter(t *testing.T) {
	var runs atomic.Int64
	work := func(context.Context) error {
		time.Sleep(10 * time.Millisecond)
		runs.Add(1)
		return nil
	}
	s := loopSide("ours", "cycle", nil, []func(context.Context) error{work, work, work})
	got, err := s.run(context.Background(), 100*time.Millisecond)
	require.NoError(t, err)
	c := got.counts[0]
	assert.Equal(t, runs.Load(), c.all)
	assert.Positive(t, c.within)
	assert.LessOrEqual(t, c.all-c.within, int64(3), "at most one run per worker after the end")
	assert.GreaterOrEqual(t, got.elapsed, 100*time.Millisecond)
}

// TestSummaryAndRPCsPerOp: the median of an even count is the mean of the middle two; RPCs
// per op are over every op of every round, keep-alive messages left out.
func TestSummaryAndRPCsPerOp(t *testing.T) {
	assert.Equal(t, summary{median: 2, low: 1, high: 9}, summarise([]float64{9, 2, 1}))
	assert.Equal(t, summary{median: 2.5, low: 1, high: 9}, summarise([]float64{9, 3, 1, 2}))
	ts := []tally{
		{time.Second, []count{{op: "cycle", within: 3, all: 4, rpcs: rpcstat.Counts{"Txn": 8, keepAlives: 5}}}, nil},
		{time.Second, []count{{op: "cycle", within: 5, all: 6, rpcs: rpcstat.Counts{"Txn": 12, "Range": 1}}}, nil},
	}
	assert.Equal(t, []map[string]float64{{"Txn": 2, "Range": 0.1}}, rpcsPerOp(ts))
}

// TestPreparedSideRepeatsUntilTheRoundIsFull: a side with prepare is prepared before each
// run and run until the runs add up to the round's length; the round's tally is their sum,
// its usage the sum of theirs.
func TestPreparedSideRepeatsUntilTheRoundIsFull(t *testing.T) {
	var did []string
	s := side{
		name:    "ours",
		prepare: func(context.Context) error { did = append(did, "prepare"); return nil },
		run: func(context.Context, time.Duration) (tally, error) {
			did = append(did, "run")
			return tally{40 * time.Millisecond, []count{{op: "handoff", within: 8, all: 8, rpcs: rpcstat.Counts{"Txn": 9}}},
				&usage{leader: map[string]float64{cpuSeconds: 0.01}, members: map[string]float64{cpuSeconds: 0.03}, clientCPU: time.Millisecond}}, nil
		},
	}
	got, err := runSide(context.Background(), s, 100*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, []string{"prepare", "run", "prepare", "run", "prepare", "run"}, did)
	assert.Equal(t, 120*time.Millisecond, got.elapsed)
	assert.Equal(t, []count{{op: "handoff", within: 24, all: 24, rpcs: rpcstat.Counts{"Txn": 27}}}, got.counts)
	assert.InDelta(t, 0.03, got.use.leader[cpuSeconds], 1e-9)
	assert.InDelta(t, 0.09, got.use.members[cpuSeconds], 1e-9)
	assert.Equal(t, 3*time.Millisecond, got.use.clientCPU)

	unread := errors.New("no metrics")
	a, b := &usage{leader: map[string]float64{}, members: map[string]float64{}}, &usage{err: unread}
	assert.ErrorIs(t, a.plus(b).err, unread)
	assert.Nil(t, a.plus(b).leader, "a round with a part unread has no server figures")

	failed := side{name: "ours", prepare: func(context.Context) error { return unread }, run: s.run}
	_, err = runSide(context.Background(), failed, time.Second)
	assert.ErrorIs(t, err, unread)
}
