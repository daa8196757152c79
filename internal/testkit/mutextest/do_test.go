package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/mutex"
)

// TestDoWhoseReleaseGetsNoAnswerReleasesInTheBackground: etcd never sees Do's release (the
// deletes are lost on the way) for longer than its 5 s: Do returns the release's error,
// saying it goes on in the background, and once the deletes get through again the key goes
// and the handle locks again.
func TestDoWhoseReleaseGetsNoAnswerReleasesInTheBackground(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out the release's 5 s")
	}
	ctx := etcdtest.Context(t)
	const name = "do-background-release"
	inj := &etcdtest.Injector{}
	m := newMutex(t, inj.Client(t, cluster), name)
	remove := inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.NamePrefix(name)), Action: etcdtest.Lose})
	err := m.Do(ctx, func(context.Context) error { return nil })
	require.Error(t, err)
	assert.NotErrorIs(t, err, mutex.ErrLost)
	assert.ErrorContains(t, err, "in the background")
	remove()
	etcdtest.AwaitKeys(t, cluster.Client(t), core.NamePrefix(name), 0)
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, m.Lock(lctx), "the handle stayed taken after the background release")
	require.NoError(t, m.Unlock(ctx))
}
