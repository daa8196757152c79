package latch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/barrier"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/latch"
)

// TestWaitsThroughARestoreAreTold: a latch's waiter and a barrier's participant wait on a
// member that is then restored from a backup taken before their reads. Their watches,
// resumed by the client past the restored revision, would wait silently for a revision the
// cluster no longer has, past every change in between; each wait is told instead that the
// cluster went back in time (ErrLost, ErrRewound), within a few probes.
func TestWaitsThroughARestoreAreTold(t *testing.T) {
	if testing.Short() {
		t.Skip("restores a member of a cluster of its own: not in the short tier")
	}
	c, err := etcdtest.NewEmbedded(1)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := c.Client(t)
	l, err := latch.New(admin, "restored")
	require.NoError(t, err)
	require.NoError(t, l.Set(ctx, 2))

	c.Stop(0)
	backup, err := c.Backup(0)
	require.NoError(t, err)
	require.NoError(t, c.Restart(0))
	for i := range 20 { // the revision moves on past the backup's
		_, err := admin.Put(ctx, fmt.Sprintf("restored-other/%d", i), "x")
		require.NoError(t, err)
	}
	waiter, err := latch.New(c.Client(t), "restored")
	require.NoError(t, err)
	wait := etcdtest.Async(func() error { return waiter.Await(ctx) })
	// The lease of a participant is granted after the backup: it is gone after the restore.
	b, err := barrier.New(c.Client(t), "restored-barrier", 2, barrier.WithTTL(30*time.Second))
	require.NoError(t, err)
	enter := etcdtest.Async(func() error { return b.Enter(ctx) })
	etcdtest.AwaitKeys(t, admin, core.NamePrefix("restored-barrier")+"in/", 1)
	etcdtest.Pending(t, wait, "the latch's wait")

	c.Stop(0)
	require.NoError(t, c.RestoreBackup(0, backup))
	require.NoError(t, c.Restart(0))
	restored := time.Now()
	// Below the revision the waits read at: their resumed watches would never see these.
	require.NoError(t, l.CountDown(ctx))
	require.NoError(t, l.CountDown(ctx))

	for what, errc := range map[string]<-chan error{"the latch's wait": wait, "the barrier's Enter": enter} {
		err := etcdtest.Within(t, errc, 30*time.Second, what)
		t.Logf("%s told %v after the restore: %v", what, time.Since(restored).Round(time.Millisecond), err)
		assert.ErrorIs(t, err, core.ErrLost, what)
		assert.ErrorIs(t, err, core.ErrRewound, what)
	}
	require.NoError(t, l.Await(ctx), "a wait begun after the restore reads the count")
}
