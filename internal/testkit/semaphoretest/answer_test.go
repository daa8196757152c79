package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestASetLimitWhoseAnswerNeverComesIsTriedAgain: SetLimit's swap of the record is applied
// but its answer never comes (a connection that died silently); the try's bound passes and
// SetLimit tries again, finds the limit it wrote, and returns long before its ctx ends (a
// try had no bound of its own: the call waited for ctx). Detach's move of the key, whose
// answer never comes either, is tried the same way.
func TestASetLimitWhoseAnswerNeverComesIsTriedAgain(t *testing.T) {
	t.Parallel()
	const name = "sem-answer-never-comes"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	inj := &etcdtest.Injector{}
	cli := inj.Client(t, cluster)
	s := newSemaphore(t, cli, name, 2)
	p, err := s.Acquire(ctx) // records the limit of 2
	require.NoError(t, err)

	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Drop, Times: 1})
	require.NoError(t, s.SetLimit(ctx, 3))
	other := newSemaphore(t, cluster.Client(t), name, 1)
	n, err := other.InUse(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, 3, other.Limit(), "etcd records the new limit")

	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Drop, Times: 1})
	ticket, err := p.Detach(ctx)
	require.NoError(t, err)
	resumed, err := other.Resume(ctx, ticket)
	require.NoError(t, err)
	require.NoError(t, resumed.Release(ctx))
	assert.NoError(t, ctx.Err(), "every call returned before ctx ended")
}
