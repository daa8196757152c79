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
// their Release frees the units; semaphore.Resume (the function) does as the method. A
// ticket of another name's permit, or under another prefix, is ErrInvalidOption.
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

	elsewhere := newSemaphore(t, cluster.Client(t), name+"-other", limit)
	_, err = elsewhere.Resume(ctx, tickets[0])
	assert.ErrorIs(t, err, semaphore.ErrInvalidOption, "a ticket of another name's permit")
	_, err = semaphore.Resume(ctx, cluster.Client(t), tickets[0], semaphore.WithPrefix("elsewhere/"))
	assert.ErrorIs(t, err, semaphore.ErrInvalidOption, "a ticket of a permit under another prefix")
	// The first resumes through the handle's method, the second through the function
	// (mutex.Resume's shape), which finds the name in the ticket.
	resume := []func(string) (*semaphore.Permit, error){
		func(ticket string) (*semaphore.Permit, error) { return other.Resume(ctx, ticket) },
		func(ticket string) (*semaphore.Permit, error) {
			return semaphore.Resume(ctx, cluster.Client(t), ticket)
		},
	}
	for i, ticket := range tickets {
		p, err := resume[i](ticket)
		require.NoError(t, err)
		assert.Equal(t, before[i], was{p.Key(), p.Token(), p.Units()})
		_, err = semaphore.Resume(ctx, cluster.Client(t), ticket)
		assert.ErrorIs(t, err, semaphore.ErrStaleTicket)
		_, err = other.Resume(ctx, ticket)
		assert.ErrorIs(t, err, semaphore.ErrStaleTicket)
		require.NoError(t, p.Release(ctx))
	}
	require.NoError(t, last.Release(ctx))
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), core.NamePrefix(name)+core.KindPermit))
}
