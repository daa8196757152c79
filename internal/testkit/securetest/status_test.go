package securetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestStatusWithAGrantOfTheNamesKeysAlone: a client granted a name's keys alone, not the
// records beside them (where asks lie), still reads and watches the name's status: Status
// shows its holder without an ask, and Watch is placed and calls back at a change.
func TestStatusWithAGrantOfTheNamesKeysAlone(t *testing.T) {
	ctx := etcdtest.Context(t)
	named := cluster.ClientAs(t, nameUser)
	m, err := mutex.New(named, namedElection, mutex.WithPrefix(appPrefix))
	require.NoError(t, err)
	require.NoError(t, m.Lock(ctx))
	snap, err := admin.Status(ctx, named, []string{namedElection}, admin.Prefix(appPrefix))
	require.NoError(t, err)
	require.Len(t, snap.Names[0].Queue, 1)
	assert.Nil(t, snap.Names[0].Queue[0].Asked)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	snaps := make(chan *admin.Snapshot, 10)
	watched := etcdtest.Async(func() error {
		return admin.Watch(wctx, named, []string{namedElection}, func(s *admin.Snapshot) error { snaps <- s; return nil }, admin.Prefix(appPrefix))
	})
	first := etcdtest.Within(t, snaps, 30*time.Second, "the first snapshot")
	assert.Len(t, first.Names[0].Queue, 1)
	require.NoError(t, m.Unlock(ctx))
	next := etcdtest.Within(t, snaps, 30*time.Second, "the snapshot after the release")
	assert.Empty(t, next.Names[0].Queue)
	stop()
	assert.ErrorIs(t, etcdtest.Within(t, watched, 30*time.Second, "Watch"), context.Canceled)
}
