package once_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/once"
)

// TestNoPeriodRunsTwiceUnderFaults: three hosts, each on a client pinned to a member of its
// own of three, run one job of a 1 s period for about ten periods while the etcd leader's
// member is stopped and restarted, and while a run's hold is taken away from under it (its
// key deleted, as an operator's release does). A run that the job recorded (Run returned
// ran and no error) happens at most once per period; a run whose hold was lost is not
// recorded, and its period may run again.
func TestNoPeriodRunsTwiceUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c, err := etcdtest.NewEmbedded(3)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const name = "once-faults"
	admin := etcdtest.SpreadClient(t, c, 0)

	var mu sync.Mutex
	recorded := map[time.Time][]int{} // period -> the hosts whose Run recorded it
	lostRuns := 0
	var armed atomic.Bool             // the next run is the one whose hold goes under it
	victim := make(chan struct{})     // closed once that run is under way
	victimDone := make(chan error, 1) // what that run's Run returned
	end := time.Now().Add(10 * time.Second)
	var hosts sync.WaitGroup
	for i := range c.Size() {
		j, err := once.New(etcdtest.PinnedClient(t, c, i), name, time.Second, once.WithTTL(5*time.Second))
		require.NoError(t, err)
		hosts.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				var start time.Time
				isVictim := false
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second) // a cron run that gives up
				ran, err := j.Run(rctx, func(ctx context.Context) error {
					start = once.Start(ctx)
					if armed.CompareAndSwap(true, false) {
						isVictim = true
						close(victim)
						<-ctx.Done() // its hold goes: the test deletes its key
						return nil   // as a job that does not check its ctx would
					}
					select { // the job's work
					case <-time.After(100 * time.Millisecond):
					case <-ctx.Done():
					}
					return nil
				})
				rcancel()
				if isVictim {
					victimDone <- err
				}
				mu.Lock()
				switch {
				case ran && err == nil:
					recorded[start] = append(recorded[start], i)
				case ran && errorsIsLost(err):
					lostRuns++
				}
				mu.Unlock()
				time.Sleep(50 * time.Millisecond) // the next cron tick: the workload, not a wait for an event
			}
		})
	}

	// The faults, in turn: the etcd leader's member stopped for 2 s, then a run's hold
	// deleted under it.
	time.Sleep(2 * time.Second) // let some periods pass first: the workload's pace, not a sync
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	c.Stop(leader)
	time.Sleep(2 * time.Second) // the outage's length is the point
	require.NoError(t, c.Restart(leader))
	armed.Store(true)
	etcdtest.Within(t, victim, 20*time.Second, "a run under way")
	_, err = admin.Delete(ctx, core.NamePrefix(name), clientv3.WithPrefix())
	require.NoError(t, err)
	hosts.Wait()

	require.GreaterOrEqual(t, len(recorded), 4, "periods recorded: %v", recorded)
	require.ErrorIs(t, etcdtest.Within(t, victimDone, time.Second, "the run whose key was deleted"), once.ErrLost)
	for start, who := range recorded {
		assert.Len(t, who, 1, "the period of %v was recorded by hosts %v", start, who)
	}
	t.Logf("%d periods recorded, %d runs lost under their hold", len(recorded), lostRuns)
	_, err = admin.Delete(ctx, core.OnceRecordKey(core.NamePrefix(name)))
	require.NoError(t, err)
}

func errorsIsLost(err error) bool { return err != nil && errors.Is(err, once.ErrLost) }
