package faulttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// runWorkload is an election's workload, as election's fault tests have it.
func runWorkload() Workload {
	return Workload{
		Open: func(cli *clientv3.Client, name string) (Locker, error) {
			e, err := election.New(cli, name, election.WithTTL(2*time.Second))
			if err != nil {
				return nil, err
			}
			return primtest.NewCandidate(e), nil
		},
		Prefix: core.NamePrefix,
		TTL:    2 * time.Second,
		Lost:   election.ErrLost,
	}
}

// TestExploreRunRecordsEveryTerm drives the explorer's Run cycle through what it must tell
// apart, one case after another on one name: a clean term (acquired, written, released);
// a term whose key an operator deletes before its first write (its release refused, and
// Run's next term a hold of its own with a higher token); a Run that never leads before its
// ctx ends (a failed acquisition, no hold); a resign that gets no answer (its release
// unknown, the worker's handle replaced: Run returned lead's error joined with the
// resign's). The history then passes every check.
func TestExploreRunRecordsEveryTerm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	env := NewEnv(t)
	w := runWorkload()
	r := env.newRun(t, w, "scoped-run")
	cli := env.Client(t, 0)
	wk := r.addWorker(t, cli)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	cycle := func(ctx context.Context) []Op {
		before := len(r.hist.Ops())
		r.exploreRun(ctx, wk, wk.lk.(leaderLoop), rng, r.hist.Now())
		return r.hist.Ops()[before:]
	}
	kinds := func(ops []Op) (s []string) {
		for _, op := range ops {
			if op.Kind == Write {
				continue
			}
			s = append(s, op.Kind.String()+" "+op.Outcome.String())
		}
		return s
	}

	clean := cycle(ctx)
	assert.Equal(t, []string{"acquire ok", "release ok"}, kinds(clean), "a clean term: %v", clean)

	r.beforeNextWrite(func(*worker, int64) {
		_, err := env.Admin.Delete(ctx, w.Prefix(r.name), clientv3.WithPrefix())
		assert.NoError(t, err)
	})
	lost := cycle(ctx)
	require.Equal(t, []string{"acquire ok", "release refused", "acquire ok", "release ok"}, kinds(lost), "a term lost, then the next: %v", lost)
	var tokens []int64
	for _, op := range lost {
		if op.Kind == Acquire {
			tokens = append(tokens, op.Token)
		}
	}
	assert.Less(t, tokens[0], tokens[1])
	assert.ErrorIs(t, lost[slices.IndexFunc(lost, func(op Op) bool { return op.Kind == Release })].Err, errTermLost)

	other, err := w.Open(env.Admin, r.name)
	require.NoError(t, err)
	require.NoError(t, other.Lock(ctx))
	failedBefore := len(r.hist.FailedLocks())
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	assert.Empty(t, cycle(sctx), "a Run that never led recorded a hold")
	scancel()
	assert.Len(t, r.hist.FailedLocks(), failedBefore+1)
	require.NoError(t, other.Unlock(ctx))

	handle := wk.lk
	cli.Inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(w.Prefix(r.name)), Action: etcdtest.Lose, Times: 1})
	unknown := cycle(ctx)
	assert.Equal(t, []string{"acquire ok", "release ambiguous"}, kinds(unknown), "a resign without an answer: %v", unknown)
	assert.NotSame(t, handle, wk.lk, "the handle whose resign got no answer was kept")

	summary, violations, err := r.Verify(t.TempDir())
	require.NoError(t, err)
	t.Log(summary)
	assert.Empty(t, violations)
}

// TestAlone: an error is the target alone only when nothing else is wrapped or joined
// with it.
func TestAlone(t *testing.T) {
	target, other := errors.New("target"), errors.New("other")
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{target, true},
		{errors.Join(target), true},
		{fmt.Errorf("run: %w", errors.Join(target, nil)), true},
		{errors.Join(errors.Join(target), target), true},
		{errors.Join(target, other), false},
		{errors.Join(other), false},
		{nil, false},
		{other, false},
	} {
		assert.Equal(t, tc.want, alone(tc.err, target), "%v", tc.err)
	}
}
