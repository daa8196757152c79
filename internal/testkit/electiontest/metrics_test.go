package election_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	mt "github.com/etcdsync/etcdsync/internal/testkit/metrictest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestMetricsCountLeaderships: a Campaign is an acquisition, a leadership a hold, a
// candidate behind the leader a waiter until it leads; a leadership ended by Shutdown is
// lost under that cause; spans tell the same.
func TestMetricsCountLeaderships(t *testing.T) {
	sr := mt.Spans(t)
	ctx, parent := mt.Parent(etcdtest.Context(t), "request")
	r := mt.NewReader(t)
	const name = "metrics-leaderships"
	prim := mt.Primitive.String("election")
	cli, nextCli := cluster.Client(t), cluster.Client(t)
	first := newElection(t, cli, name, election.WithMeterProvider(r.Provider))
	next := newElection(t, nextCli, name, election.WithMeterProvider(r.Provider))

	require.NoError(t, first.Campaign(ctx, "first"))
	campaigned := campaignAsync(ctx, next, "next")
	primtest.AwaitKeys(t, cli, name, 2)
	assert.EqualValues(t, 1, r.Collect(t).Sum(mt.Waiters, prim), "one candidate waits")
	require.NoError(t, first.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, campaigned, 10*time.Second, "the next candidate, once the first resigned"))
	next.Done() // watch the leadership, so that its loss is seen at once
	require.NoError(t, election.Shutdown(ctx, nextCli))
	etcdtest.Within(t, next.Done(), 10*time.Second, "Done after Shutdown")
	parent.End()

	d := r.Collect(t)
	assert.EqualValues(t, 2, d.Count(mt.AcquireDuration, prim, mt.Outcome.String("acquired")))
	assert.EqualValues(t, 2, d.Count(mt.AcquireDuration), "nothing else")
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, mt.Outcome.String("released")))
	assert.EqualValues(t, 1, d.Count(mt.HoldDuration, prim, mt.Outcome.String("lost")))
	assert.EqualValues(t, 1, d.Sum(mt.HoldLost, prim, mt.Cause.String("shutdown")))
	assert.EqualValues(t, 1, d.Sum(mt.HoldLost), "nothing else")
	assert.EqualValues(t, 0, d.Sum(mt.Holds), "holds back to zero")
	assert.EqualValues(t, 0, d.Sum(mt.Waiters), "waiters back to zero")

	assert.Equal(t, []string{"acquired", "acquired"}, mt.Outcomes(sr, "etcdsync.election.Campaign"))
	assert.Equal(t, []string{"released"}, mt.Outcomes(sr, "etcdsync.election.Resign"))
}

// TestMetricsCountRunsStepDowns: each term of Run that ends is one step-down under its cause:
// lead returned nil (Run campaigns again), then lead's error (Run stops); each term is a hold.
func TestMetricsCountRunsStepDowns(t *testing.T) {
	r := mt.NewReader(t)
	const name = "metrics-stepdowns"
	prim := mt.Primitive.String("election")
	e := newElection(t, cluster.Client(t), name, election.WithMeterProvider(r.Provider))
	errStop := errors.New("stop")
	terms := 0
	err := e.Run(etcdtest.Context(t), "v", func(context.Context) error {
		if terms++; terms == 1 {
			return nil
		}
		return errStop
	})
	require.ErrorIs(t, err, errStop)
	d := r.Collect(t)
	assert.EqualValues(t, 1, d.Sum(mt.LeaderStepdowns, prim, mt.Cause.String("returned")))
	assert.EqualValues(t, 1, d.Sum(mt.LeaderStepdowns, prim, mt.Cause.String("error")))
	assert.EqualValues(t, 2, d.Sum(mt.LeaderStepdowns), "nothing else")
	assert.EqualValues(t, 2, d.Count(mt.HoldDuration, prim, mt.Outcome.String("released")), "a term is a hold")
}
