package mutex_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestOverlappingMultisInOppositeOrdersNeverDeadlock: workers take overlapping sets of
// names listed in opposite orders (a, b / b, a; b, c, a / c, b), beside single Mutexes on
// each name, on a 3-member cluster with clients spread over the members under background
// writes. Taken one by one in the callers' orders, these would deadlock; every worker must
// finish all its rounds, and no name ever has two holders.
func TestOverlappingMultisInOppositeOrdersNeverDeadlock(t *testing.T) {
	t.Parallel()
	c := etcdtest.LaggingCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const rounds = 15
	sets := [][]string{
		{"dl-a", "dl-b"}, {"dl-b", "dl-a"},
		{"dl-b", "dl-c", "dl-a"}, {"dl-c", "dl-b"},
		{"dl-c", "dl-a"}, {"dl-a", "dl-c", "dl-b"},
	}
	singles := []string{"dl-a", "dl-b", "dl-c"}
	inside := map[string]*atomic.Int64{}
	for _, n := range singles {
		inside[n] = &atomic.Int64{}
	}
	enter := func(names []string) {
		for _, n := range names {
			assert.Equal(t, int64(1), inside[n].Add(1), "two holders of %s at once", n)
		}
	}
	leave := func(names []string) {
		for _, n := range names {
			inside[n].Add(-1)
		}
	}
	var finished atomic.Int64
	var wg sync.WaitGroup
	worker := 0
	for _, set := range sets {
		cli := etcdtest.SpreadClient(t, c, worker)
		m := newMulti(t, cli, set)
		worker++
		wg.Go(func() {
			for i := range rounds {
				if !assert.NoError(t, m.Lock(ctx), "Multi %v, round %d", set, i) {
					return
				}
				enter(m.Names())
				// A write fenced on every name, which also keeps the hold a round trip long.
				txn, err := cli.Txn(ctx).If(m.IsOwner()...).Then(clientv3.OpPut("deadlock-data/"+set[0], fmt.Sprint(m.Token()))).Commit()
				assert.True(t, err == nil && txn.Succeeded, "fenced write under a held Multi: %v", err)
				leave(m.Names())
				if !assert.NoError(t, m.Unlock(ctx)) {
					return
				}
			}
			finished.Add(1)
		})
	}
	for _, name := range singles {
		cli := etcdtest.SpreadClient(t, c, worker)
		m := newMutex(t, cli, name)
		worker++
		wg.Go(func() {
			for i := range rounds {
				if !assert.NoError(t, m.Lock(ctx), "Mutex %s, round %d", name, i) {
					return
				}
				enter([]string{name})
				txn, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("deadlock-data/"+name, fmt.Sprint(m.Token()))).Commit()
				assert.True(t, err == nil && txn.Succeeded, "fenced write under a held Mutex: %v", err)
				leave([]string{name})
				if !assert.NoError(t, m.Unlock(ctx)) {
					return
				}
			}
			finished.Add(1)
		})
	}
	wg.Wait()
	assert.Equal(t, int64(len(sets)+len(singles)), finished.Load(), fmt.Sprintf("workers finished of %d", len(sets)+len(singles)))
}
