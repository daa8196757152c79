package election_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// collect reads obs until it yields Leader{} after a leader was seen, or ctx ends, and
// returns what it read; first is closed once the first Leader has arrived.
func collect(ctx context.Context, obs <-chan election.Leader, first chan<- struct{}) []election.Leader {
	var seen []election.Leader
	for {
		select {
		case l, ok := <-obs:
			if !ok {
				return seen
			}
			seen = append(seen, l)
			if len(seen) == 1 {
				close(first)
			}
			if l == (election.Leader{}) && len(seen) > 1 {
				return seen
			}
		case <-ctx.Done():
			return seen
		}
	}
}

// checkSequence checks that seen holds values 0..last of one leader, in increasing order
// with none repeated (all of them if every is set), then Leader{}.
func checkSequence(t *testing.T, seen []election.Leader, token int64, last int, every bool) {
	t.Helper()
	require.NotEmpty(t, seen)
	require.Equal(t, election.Leader{}, seen[len(seen)-1], "the last thing seen is not 'no leader': %v", seen)
	prev := -1
	for _, l := range seen[:len(seen)-1] {
		n, err := strconv.Atoi(l.Value)
		require.NoError(t, err)
		assert.Equal(t, token, l.Token)
		if every {
			require.Equal(t, prev+1, n, "skipped, repeated or reordered: %v", seen)
		} else {
			require.Greater(t, n, prev, "repeated or reordered: %v", seen)
		}
		prev = n
	}
	assert.Equal(t, last, prev, "the latest value was not seen")
}

// TestObserveAcrossLeaderMemberRestart proclaims a sequence of values on a 3-member
// cluster while large background writes keep followers applying behind the leader; etcd's
// leader is stopped a third of the way and restarted at two thirds. Observers on clients
// spread over the members, whose watches move to another member, must see every value
// once, in order, then "no leader".
func TestObserveAcrossLeaderMemberRestart(t *testing.T) {
	c := etcdtest.LaggingCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name, values = "observe-restart", 60

	leader := newElection(t, c.Client(t), name)
	require.NoError(t, leader.Campaign(ctx, "0"))

	seen := make([][]election.Leader, 2*c.Size())
	var wg sync.WaitGroup
	for i := range seen {
		obs := newElection(t, etcdtest.SpreadClient(t, c, i), name).Observe(ctx)
		first := make(chan struct{})
		wg.Go(func() { seen[i] = collect(ctx, obs, first) })
		etcdtest.Within(t, first, 20*time.Second, "the first leader")
	}
	member := -1
	for v := 1; v <= values; v++ {
		switch v {
		case values / 3:
			var err error
			member, err = c.Leader(ctx)
			require.NoError(t, err)
			c.Stop(member)
		case 2 * values / 3:
			require.NoError(t, c.Restart(member))
		}
		pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
		require.NoError(t, leader.Proclaim(pctx, strconv.Itoa(v)))
		pcancel()
	}
	token := leader.Token()
	require.NoError(t, leader.Resign(ctx))
	wg.Wait()
	for i := range seen {
		checkSequence(t, seen[i], token, values, true)
	}
}

// TestObserveAcrossCompaction stops the member an observer's client talks to, proclaims
// while it is down and compacts the history, then restarts it: the client's resumed watch
// finds its revision compacted, and the observer must read again and send the latest
// value, without repeating or reordering, and without closing.
func TestObserveAcrossCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name, values = "observe-compaction", 20

	etcdLeader, err := c.Leader(ctx)
	require.NoError(t, err)
	follower := (etcdLeader + 1) % c.Size()
	admin := etcdtest.PinnedClient(t, c, etcdLeader)
	leader := newElection(t, admin, name)
	require.NoError(t, leader.Campaign(ctx, "0"))

	obs := newElection(t, etcdtest.PinnedClient(t, c, follower), name).Observe(ctx)
	seen := []election.Leader{primtest.NextLeader(t, obs)}
	require.NoError(t, leader.Proclaim(ctx, "1"))
	c.Stop(follower)
	for v := 2; v <= values; v++ {
		require.NoError(t, leader.Proclaim(ctx, strconv.Itoa(v)))
	}
	_, err = admin.Compact(ctx, etcdtest.Revision(t, admin), clientv3.WithCompactPhysical())
	require.NoError(t, err)
	require.NoError(t, c.Restart(follower))

	// The latest value can reach the observer only by a read after the compaction.
	for seen[len(seen)-1].Value != strconv.Itoa(values) {
		seen = append(seen, primtest.NextLeader(t, obs))
	}
	require.NoError(t, leader.Resign(ctx))
	seen = append(seen, primtest.NextLeader(t, obs))
	checkSequence(t, seen, seen[0].Token, values, false)
}
