package semaphore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/semaphore"
)

// TestDetachedPermitsKeepTheirUnitsAndResumeOnce: permits of one and of two units, detached,
// keep their units taken (a try for the last unit is refused); Resume on another client
// gives back permits with the same keys, tokens and units, a second Resume is stale, and
// their Release frees the units. A ticket of another name's permit is ErrInvalidOption.
func TestDetachedPermitsKeepTheirUnitsAndResumeOnce(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name, limit = "sem-detach", 4
	s := newSemaphore(t, cluster.Client(t), name, limit)
	one, err := s.Acquire(ctx)
	require.NoError(t, err)
	two, err := s.AcquireN(ctx, 2)
	require.NoError(t, err)
	type was struct {
		key   string
		token int64
		units int
	}
	before := []was{{one.Key(), one.Token(), 1}, {two.Key(), two.Token(), 2}}
	var tickets []string
	for _, p := range []*semaphore.Permit{one, two} {
		ticket, err := p.Detach(ctx)
		require.NoError(t, err)
		tickets = append(tickets, ticket)
		assert.Zero(t, p.Units(), "a detached permit holds nothing")
	}
	other := newSemaphore(t, cluster.Client(t), name, limit)
	last, err := other.TryAcquire(ctx)
	require.NoError(t, err, "the fourth unit is free")
	_, err = other.TryAcquire(ctx)
	require.ErrorIs(t, err, semaphore.ErrNoPermits, "the detached units are still taken")

	for i, ticket := range tickets {
		p, err := other.Resume(ctx, ticket)
		require.NoError(t, err)
		assert.Equal(t, before[i], was{p.Key(), p.Token(), p.Units()})
		_, err = other.Resume(ctx, ticket)
		assert.ErrorIs(t, err, semaphore.ErrStaleTicket)
		require.NoError(t, p.Release(ctx))
	}
	elsewhere := newSemaphore(t, cluster.Client(t), name+"-other", limit)
	_, err = elsewhere.Resume(ctx, tickets[0])
	assert.ErrorIs(t, err, semaphore.ErrInvalidOption)
	require.NoError(t, last.Release(ctx))
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), core.NamePrefix(name)+core.KindPermit))
}
