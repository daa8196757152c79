package etcdtest

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// LaggingCluster returns an embedded 3-member cluster whose followers apply behind the
// leader while the test runs: a client spread over the members puts large values under
// "lag-data/" until the test ends (BackgroundWrites). Waiters on clients spread over it see
// watches served by members that trail the one that answered their Txn. It skips the test
// under -short.
//
// The cluster is started by the first test of the binary that asks for it and shared by
// the later ones (the writes are each test's own); Main closes it. Tests on it should use
// names of their own.
func LaggingCluster(t *testing.T) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	lagging.once.Do(func() {
		lagging.c, lagging.err = NewEmbedded(3)
	})
	if lagging.err != nil {
		t.Fatal(lagging.err)
	}
	c := lagging.c
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	t.Cleanup(BackgroundWrites(ctx, t, SpreadClient(t, c, 0), "lag-data/"))
	return c
}

// lagging is the binary's LaggingCluster, closed by closeShared.
var lagging struct {
	once sync.Once
	c    *Cluster
	err  error
}

// closeShared closes the clusters that tests of this binary shared.
func closeShared() {
	if lagging.c != nil {
		lagging.c.Close()
	}
}

// Tally counts errors by their text, for a failure message that lists each once.
type Tally struct {
	counts sync.Map // text -> *atomic.Int64
}

// Add counts err.
func (t *Tally) Add(err error) {
	v, _ := t.counts.LoadOrStore(err.Error(), new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// String lists the errors counted, "text ×n" each, sorted; "" when there were none.
func (t *Tally) String() string {
	var lines []string
	t.counts.Range(func(k, v any) bool {
		lines = append(lines, k.(string)+" ×"+strconv.FormatInt(v.(*atomic.Int64).Load(), 10))
		return true
	})
	sort.Strings(lines)
	return strings.Join(lines, "; ")
}

// Cycles runs cycle n times on each of workers goroutines at once (worker is 0 to
// workers-1), until ctx ends, and returns how many cycles completed. A cycle that returns
// an error while ctx lasts is counted in spurious, by its text, and run again: in a test of
// exclusion on a healthy cluster, that is a hold lost for nothing.
func Cycles(ctx context.Context, workers, n int, cycle func(ctx context.Context, worker int) error) (done int64, spurious *Tally) {
	spurious = new(Tally)
	var completed atomic.Int64
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for k := 0; k < n && ctx.Err() == nil; {
				if err := cycle(ctx, i); err != nil {
					if ctx.Err() == nil {
						spurious.Add(err)
					}
					continue
				}
				k++
				completed.Add(1)
			}
		})
	}
	wg.Wait()
	return completed.Load(), spurious
}
