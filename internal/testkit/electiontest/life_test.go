package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestMaxHoldBoundsATermAndRotatesTheLead: two Runs whose terms last at most a second take
// turns: each term's ctx ends with ErrMaxHold as its cause, and the next term is the other
// candidate's.
func TestMaxHoldBoundsATermAndRotatesTheLead(t *testing.T) {
	const name = "run-maxhold"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type term struct {
		who   string
		cause error
	}
	terms := make(chan term, 16)
	run := func(who string) <-chan error {
		e := newElection(t, cluster.Client(t), name, election.WithMaxHold(time.Second))
		return etcdtest.Async(func() error {
			return e.Run(ctx, who, func(lctx context.Context) error {
				<-lctx.Done()
				terms <- term{who, context.Cause(lctx)}
				return nil
			})
		})
	}
	a, b := run("a"), run("b")
	var whos []string
	for range 4 {
		tm := etcdtest.Within(t, terms, 20*time.Second, "a term's end")
		if ctx.Err() == nil {
			assert.ErrorIs(t, tm.cause, etcdsync.ErrMaxHold, "term of %s", tm.who)
		}
		whos = append(whos, tm.who)
	}
	cancel()
	for _, errc := range []<-chan error{a, b} {
		require.ErrorIs(t, etcdtest.Within(t, errc, 20*time.Second, "Run's return"), context.Canceled)
	}
	for i := 1; i < len(whos); i++ {
		assert.NotEqual(t, whos[i-1], whos[i], "the lead rotates: %v", whos)
	}
}
