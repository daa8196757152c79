package etcdtest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestConfinedWatches: a confined client's watch of a key, of a prefix and of every key
// sees the keys under its prefix, without it, and nothing outside.
func TestConfinedWatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	outer := cluster.Client(t)
	cli, err := cluster.NewClient()
	require.NoError(t, err)
	defer cli.Close()
	const prefix = "confined-test/"
	etcdtest.Confine(cli, prefix)
	rev := etcdtest.Revision(t, outer)
	watches := map[string]clientv3.WatchChan{
		"key":    cli.Watch(ctx, "k", clientv3.WithRev(rev+1)),
		"prefix": cli.Watch(ctx, "k", clientv3.WithPrefix(), clientv3.WithRev(rev+1)),
		"all":    cli.Watch(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev+1)),
	}
	for _, k := range []string{"outside", prefix + "k", prefix + "k2"} {
		_, err := outer.Put(ctx, k, "v")
		require.NoError(t, err)
	}
	want := map[string][]string{"key": {"k"}, "prefix": {"k", "k2"}, "all": {"k", "k2"}}
	for name, w := range watches {
		var got []string
		for len(got) < len(want[name]) {
			resp := etcdtest.Within(t, w, 10*time.Second, name)
			require.NoError(t, resp.Err(), name)
			for _, ev := range resp.Events {
				got = append(got, string(ev.Kv.Key))
			}
		}
		assert.Equal(t, want[name], got, name)
	}
	_, err = outer.Delete(ctx, "outside")
	require.NoError(t, err)
	_, err = outer.Delete(ctx, prefix, clientv3.WithPrefix())
	require.NoError(t, err)
}

// TestAConfinedClientClosesBesideItsWatches: Close while goroutines keep placing watches
// ends them and never panics (etcd's namespace.NewWatcher did: "WaitGroup is reused before
// previous Wait has returned", seen in CI when the command's client closed while a watch of
// etcdsync's was being placed); a Watch after Close returns a closed channel.
func TestAConfinedClientClosesBesideItsWatches(t *testing.T) {
	for range 50 {
		cli, err := cluster.NewClient()
		require.NoError(t, err)
		etcdtest.Confine(cli, "confined-close/")
		// Watches that last until Close, and watches on a done ctx placed over and over
		// beside them (their channels close at once): Close waits for the first while the
		// others come and go.
		for range 4 {
			cli.Watch(cli.Ctx(), "k")
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					for range cli.Watch(done, "k") {
					}
				}
			})
		}
		require.NoError(t, cli.Close())
		close(stop)
		wg.Wait()
		_, open := <-cli.Watch(context.Background(), "k")
		assert.False(t, open, "a Watch after Close")
	}
}
