package misusetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/trylock"
)

// TestTheLastUnlockOutlivesADeadlineThatPassesMidDelete: `defer m.Unlock(ctx)`, the
// README's pattern, with a ctx whose deadline passes while the last Unlock's delete is in
// flight (etcd gets it only 1.5 s later, past the deadline and past the core's second of
// grace for an answer). The delete finishes all the same: the lock is free, not kept with
// a count of 1 by a key that the shared keep-alive renews for the process's life.
func TestTheLastUnlockOutlivesADeadlineThatPassesMidDelete(t *testing.T) {
	const name = "misuse-reentrant-deadline"
	var inj etcdtest.Injector
	m, err := reentrant.New(inj.Client(t, cluster), name)
	require.NoError(t, err)
	owner, err := m.Lock(etcdtest.Context(t))
	require.NoError(t, err)

	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.NamePrefix(name)),
		Action: etcdtest.Hold, Delay: 1500 * time.Millisecond, Times: 1})
	ctx, cancel := context.WithTimeout(owner, 200*time.Millisecond)
	defer cancel()
	assert.NoError(t, m.Unlock(ctx))
	assert.Zero(t, m.Count(owner))
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), core.NamePrefix(name)), "keys left")

	other, err := reentrant.New(cluster.Client(t), name)
	require.NoError(t, err)
	octx, err := other.TryLock(etcdtest.Context(t))
	require.NoError(t, err, "another owner takes the lock")
	require.NoError(t, other.Unlock(octx))
}

// TestTimeoutOverReentrantHandsBackALiveOwningContext: the owning context that
// trylock.Reentrant hands back after a Timeout lives as long as the hold, although the
// try ran on Timeout's own context, which ends when Timeout returns; it re-enters, and the
// last Unlock cancels it. The same when the ctx given to Timeout owns the hold already.
func TestTimeoutOverReentrantHandsBackALiveOwningContext(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "misuse-timeout-reentrant"
	m, err := reentrant.New(cluster.Client(t), name)
	require.NoError(t, err)
	l := trylock.Reentrant(m)
	require.NoError(t, trylock.Timeout(ctx, l, 5*time.Second))
	owner := l.Context()
	require.NotNil(t, owner)
	assert.NoError(t, owner.Err(), "the owning context lives")
	assert.Equal(t, 1, m.Count(owner))

	again := trylock.Reentrant(m)
	require.NoError(t, trylock.Timeout(owner, again, 5*time.Second), "the owning context re-enters")
	assert.NoError(t, again.Context().Err(), "the re-entered context lives")
	assert.Equal(t, 2, m.Count(owner))
	_, err = m.Lock(again.Context())
	require.NoError(t, err)

	for range 3 {
		require.NoError(t, m.Unlock(owner))
	}
	assert.ErrorIs(t, owner.Err(), context.Canceled, "the last Unlock cancels it")
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), core.NamePrefix(name)), "keys left")
}
