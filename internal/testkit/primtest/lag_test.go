package primtest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestExclusionWithClientsOnLaggingMembers: clients spread over a 3-member cluster, while
// large writes on other keys keep the followers applying behind the leader, take and
// release one name in turn. A waiter's watch served by a follower then starts below the
// revision of the waiter's own Txn and replays deletes its snapshot already reflects: the
// delete of an earlier incarnation of its own reused key, or of a predecessor's key that was
// re-created before the snapshot. Taken as news, the first is a spurious ErrLost and the
// second lets the waiter in while its predecessor holds. So no exclusive hold may be inside
// beside another hold, and no Lock, hold or Unlock may fail. Three clients open First and
// one Second, so that each way an rwmutex's two sides meet has a mix of its own (three
// writers and a reader, three readers and a writer). trylock.Retry waits with no key: a
// replayed delete only wakes it to try again, one Txn that etcd decides.
//
// What differs per primitive under lag runs in faulttest, whose clusters lag the same way:
// permits of several units, reader goroutines that share a handle's key, nested holds.
func TestExclusionWithClientsOnLaggingMembers(t *testing.T) {
	// Its few clients approach as a fleet's far-back waiters do (see package core's
	// follow.go): a waiter with more than one key ahead, on a client with no watch of the
	// name, watches a key ahead before it joins the watch.
	t.Cleanup(core.SetNearAhead(1))
	c := etcdtest.LaggingCluster(t)
	for _, k := range primtest.Kinds {
		if !k.InLine {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel() // names, clients and handles of its own; it measures no time
			exclusionUnderLag(t, c, k)
		})
	}
}

func exclusionUnderLag(t *testing.T, c *etcdtest.Cluster, k primtest.Kind) {
	const clients, cycles = 4, 50 // per kind: 200 holds
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	name := "lag-" + k.Name
	handles := make([]primtest.Locker, clients)
	for i := range handles {
		open := k.First
		if i == clients-1 {
			open = k.Second
		}
		handles[i] = open.Make(t, etcdtest.SpreadClient(t, c, i), name)
	}
	var exclusive, shared, overlaps, sharedReads atomic.Int64
	done, spurious := etcdtest.Cycles(ctx, clients, cycles, func(ctx context.Context, i int) error {
		l := handles[i]
		if err := l.Lock(ctx); err != nil {
			return err
		}
		if l.Token() != 0 { // an exclusive hold; a read hold has no token
			if exclusive.Add(1) != 1 || shared.Load() != 0 {
				overlaps.Add(1)
			}
			time.Sleep(time.Millisecond) // the work: lets a wrongly admitted hold overlap it
			exclusive.Add(-1)
		} else {
			if shared.Add(1) > 1 {
				sharedReads.Add(1)
			}
			if exclusive.Load() != 0 {
				overlaps.Add(1)
			}
			time.Sleep(time.Millisecond)
			shared.Add(-1)
		}
		if err := l.Err(); err != nil {
			return err // lost while held, though nothing was
		}
		return l.Unlock(ctx)
	})
	require.NoError(t, ctx.Err(), "out of time after %d cycles", done)

	assert.Zero(t, overlaps.Load(), "an exclusive hold beside another, in %d cycles", done)
	assert.Empty(t, spurious.String(), "a cycle failed although nothing was lost: %s", spurious.String())
	assert.Equal(t, int64(clients*cycles), done)
	if sharedReads.Load() > 0 {
		t.Logf("%d cycles, %d reads beside another", done, sharedReads.Load())
	}
}
