package primtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestAClusterThatGoesBackInTimeEndsHoldsAndNeverHandsOutAnOlderToken: on one member,
// client 1 holds a mutex and leads an election; the member's data is backed up; client 1
// releases and resigns, client 2 takes the mutex (a higher token) and leads; the member is
// restored from the backup. Client 2's key is gone without a delete event, and client 1's
// released key and leadership come back on its live lease. Every client must notice the
// revision going back: client 2's hold ends with ErrLost saying so, client 1's new Lock
// never returns a token at or below one handed out before, the resurrected keys go with the
// leases, and an observer on a client that only observes starts over with what is true now
// (nobody leads).
func TestAClusterThatGoesBackInTimeEndsHoldsAndNeverHandsOutAnOlderToken(t *testing.T) {
	if testing.Short() {
		t.Skip("restores a member of a cluster of its own: not in the short tier")
	}
	c, err := etcdtest.NewEmbedded(1)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli1, cli2, admin := c.Client(t), c.Client(t), c.Client(t)
	// The sessions must outlive each stop of the member (a backup, or a restore, and a
	// restart: over 10 s on a loaded machine) until their local deadline, ttl after the last
	// renewal; the clients notice the restore by a renewal's answer, one every ttl/3, well
	// within told and the 20 s that AwaitKeys waits.
	const ttl = 30 * time.Second
	const told = 45 * time.Second

	m1, err := mutex.New(cli1, "rewind", mutex.WithTTL(ttl))
	require.NoError(t, err)
	m2, err := mutex.New(cli2, "rewind", mutex.WithTTL(ttl))
	require.NoError(t, err)
	e1, err := election.New(cli1, "rewind-election", election.WithTTL(ttl))
	require.NoError(t, err)
	e2, err := election.New(cli2, "rewind-election", election.WithTTL(ttl))
	require.NoError(t, err)
	watcher, err := election.New(admin, "rewind-election") // a client that only observes
	require.NoError(t, err)

	require.NoError(t, m1.Lock(ctx))
	tok1 := m1.Token()
	require.NoError(t, e1.Campaign(ctx, "one"))
	// Client 2's lease exists before the backup too, so that it comes back with it.
	other, err := mutex.New(cli2, "rewind-other", mutex.WithTTL(ttl))
	require.NoError(t, err)
	require.NoError(t, other.Lock(ctx))
	require.NoError(t, other.Unlock(ctx))

	stopped := time.Now()
	c.Stop(0)
	backup, err := c.Backup(0)
	require.NoError(t, err)
	require.NoError(t, c.Restart(0))
	t.Logf("the member was down %v for the backup", time.Since(stopped).Round(time.Millisecond))

	require.NoError(t, m1.Unlock(ctx))
	require.NoError(t, e1.Resign(ctx))
	require.NoError(t, m2.Lock(ctx))
	tok2 := m2.Token()
	require.Greater(t, tok2, tok1)
	require.NoError(t, e2.Campaign(ctx, "two"))
	observed := watcher.Observe(ctx)
	awaitLeaderValue(t, observed, "two")
	done := m2.Done()

	stopped = time.Now()
	c.Stop(0)
	require.NoError(t, c.RestoreBackup(0, backup))
	require.NoError(t, c.Restart(0))
	restored := time.Now()
	t.Logf("the member was down %v for the restore", restored.Sub(stopped).Round(time.Millisecond))

	etcdtest.Within(t, done, told, "client 2's Done after the restore")
	t.Logf("client 2 told %v after the restore: %v", time.Since(restored).Round(time.Millisecond), m2.Err())
	assert.ErrorIs(t, m2.Err(), core.ErrLost)
	assert.ErrorIs(t, m2.Err(), core.ErrRewound)
	assert.ErrorIs(t, m2.Unlock(ctx), core.ErrLost)
	etcdtest.Within(t, e2.Done(), 20*time.Second, "client 2's leadership after the restore")

	// Client 1's released key came back on its lease; once client 1 noticed, it is gone.
	etcdtest.AwaitKeys(t, admin, core.NamePrefix("rewind"), 0)
	etcdtest.AwaitKeys(t, admin, core.NamePrefix("rewind-election"), 0)
	awaitLeaderValue(t, observed, "")

	lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
	defer lcancel()
	if err := m1.Lock(lctx); err != nil {
		assert.ErrorIs(t, err, core.ErrRewound)
		t.Logf("client 1's Lock after the restore: %v", err)
	} else {
		assert.Greater(t, m1.Token(), tok2, "a token went back")
		assert.NoError(t, m1.Unlock(ctx))
	}
	require.NoError(t, core.Shutdown(ctx, cli1))
	require.NoError(t, core.Shutdown(ctx, cli2))
	etcdtest.AwaitKeys(t, admin, core.NamePrefix("rewind"), 0)
}
