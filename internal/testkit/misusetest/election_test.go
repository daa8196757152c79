package misusetest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestASecondCampaignIsWokenByTheLossOfTheLeadership: a Campaign on a handle that leads
// waits, as documented, for the leadership to end; a loss ends it as much as a Resign (a
// lost leader never resigns): once the leader's key is deleted, the waiting Campaign
// forgets the lost leadership, campaigns and leads.
func TestASecondCampaignIsWokenByTheLossOfTheLeadership(t *testing.T) {
	ctx := etcdtest.Context(t)
	admin := cluster.Client(t)
	e, err := election.New(cluster.Client(t), "misuse-second-campaign")
	require.NoError(t, err)
	require.NoError(t, e.Campaign(ctx, "first"))
	first, key := e.Token(), e.Key()

	again := etcdtest.Async(func() error { return e.Campaign(ctx, "second") })
	select {
	case err := <-again:
		t.Fatalf("the second Campaign returned (%v) while the handle leads", err)
	case <-time.After(300 * time.Millisecond):
	}
	_, err = admin.Delete(ctx, key)
	require.NoError(t, err)
	require.NoError(t, etcdtest.Within(t, again, 10*time.Second, "the second Campaign after the loss"))
	assert.Greater(t, e.Token(), first)
	leader, err := e.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, election.Leader{Value: "second", Token: e.Token()}, leader)
	require.NoError(t, e.Resign(ctx))
}
