package primtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestMaxHoldEndsTheHoldAndServesTheNext: with WithMaxHold(d) a hold ends by itself no
// sooner than d after it was asked for: Done closes, Err matches ErrMaxHold and ErrLost, its
// key goes and a waiter is served; Unlock then says the hold was lost.
func TestMaxHoldEndsTheHoldAndServesTheNext(t *testing.T) {
	const d = time.Second
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			ctx := etcdtest.Context(t)
			name := "maxhold-" + k.Name
			admin := cluster.Client(t)
			first := k.First.Make(t, cluster.Client(t), name, etcdsync.WithMaxHold(d))
			asked := time.Now()
			require.NoError(t, first.Lock(ctx))
			key := first.Key()
			waiter := k.Second.Make(t, cluster.Client(t), name)
			served := etcdtest.Async(func() error { return waiter.Lock(ctx) })

			etcdtest.Within(t, first.Done(), 20*time.Second, "the end of the hold")
			assert.GreaterOrEqual(t, time.Since(asked), d, "ended before its maximum")
			assert.ErrorIs(t, first.Err(), etcdsync.ErrMaxHold)
			assert.ErrorIs(t, first.Err(), core.ErrLost)
			require.NoError(t, etcdtest.Within(t, served, 20*time.Second, "the waiter, once the hold ended"))
			assert.Zero(t, etcdtest.CountKeys(t, admin, key), "the ended hold's key")
			assert.ErrorIs(t, first.Unlock(ctx), core.ErrLost)
			require.NoError(t, waiter.Unlock(ctx))
			assert.Zero(t, etcdtest.CountKeys(t, admin, k.Keys(name)), "a key left")
		})
	}
}

// TestMaxHoldEndsDosContext: Do's fn sees its ctx end with ErrMaxHold as the cause, and Do
// returns the loss; nothing is left.
func TestMaxHoldEndsDosContext(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			ctx := etcdtest.Context(t)
			name := "maxhold-do-" + k.Name
			l := k.First.Make(t, cluster.Client(t), name, etcdsync.WithMaxHold(time.Second))
			d, ok := l.(primtest.Doer)
			if !ok {
				t.Skipf("%s has no Do", k.Name)
			}
			err := d.Do(ctx, func(fctx context.Context) error {
				select {
				case <-fctx.Done():
				case <-time.After(20 * time.Second):
					t.Error("fn's ctx did not end within 20s")
				}
				assert.ErrorIs(t, context.Cause(fctx), etcdsync.ErrMaxHold)
				return nil
			})
			assert.ErrorIs(t, err, etcdsync.ErrMaxHold)
			assert.ErrorIs(t, err, core.ErrLost)
			assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), k.Keys(name)), "a key left")
		})
	}
}

// TestLockDelayFollowsALeaseThatWentNotARelease: a waiter with WithLockDelay(d) whose
// holder's lease is revoked (as when its holder crashed and its lease ran out) is served no
// sooner than d after the holder's key went; one whose holder releases, and then shuts
// down its client's leases, is served at once (well within a lock-delay of 20 s).
func TestLockDelayFollowsALeaseThatWentNotARelease(t *testing.T) {
	for _, k := range primtest.Kinds {
		if !k.InLine {
			continue // a try does not wait in line: it takes a free name at once
		}
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("lease revoked", func(t *testing.T) {
				const d = 2 * time.Second
				ctx := etcdtest.Context(t)
				name := "lockdelay-revoked-" + k.Name
				admin := cluster.Client(t)
				first := k.First.Make(t, cluster.Client(t), name)
				require.NoError(t, first.Lock(ctx))
				lease := leaseOfKey(t, admin, first.Key())
				waiter := k.Second.Make(t, cluster.Client(t), name, etcdsync.WithLockDelay(d))
				served := etcdtest.Async(func() error { return waiter.Lock(ctx) })
				etcdtest.AwaitKeys(t, admin, k.Keys(name), 2)

				revoked := time.Now()
				_, err := admin.Revoke(ctx, lease)
				require.NoError(t, err)
				require.NoError(t, etcdtest.Within(t, served, 20*time.Second, "the waiter"))
				assert.GreaterOrEqual(t, time.Since(revoked), d, "served within the lock-delay of a lease's end")
				require.NoError(t, waiter.Unlock(ctx))
			})
			t.Run("released", func(t *testing.T) {
				const d = 20 * time.Second
				ctx := etcdtest.Context(t)
				name := "lockdelay-released-" + k.Name
				admin := cluster.Client(t)
				holderCli := cluster.Client(t)
				first := k.First.Make(t, holderCli, name)
				require.NoError(t, first.Lock(ctx))
				waiter := k.Second.Make(t, cluster.Client(t), name, etcdsync.WithLockDelay(d))
				served := etcdtest.Async(func() error { return waiter.Lock(ctx) })
				etcdtest.AwaitKeys(t, admin, k.Keys(name), 2)

				released := time.Now()
				require.NoError(t, first.Unlock(ctx))
				// as a process on its way out: the lease, now without a key, is not revoked
				require.NoError(t, etcdsync.Shutdown(ctx, holderCli))
				require.NoError(t, etcdtest.Within(t, served, 20*time.Second, "the waiter"))
				assert.Less(t, time.Since(released), d, "a release waited for the lock-delay")
				require.NoError(t, waiter.Unlock(ctx))
			})
		})
	}
}

// TestLockDelayIsBoundedAndMaxHoldPositive: out-of-range values are ErrInvalidOption from
// every New.
func TestLockDelayIsBoundedAndMaxHoldPositive(t *testing.T) {
	cli := cluster.Client(t)
	for _, k := range primtest.Kinds {
		for _, opt := range []core.Option{etcdsync.WithMaxHold(0), etcdsync.WithMaxHold(-time.Second),
			etcdsync.WithLockDelay(-time.Millisecond), etcdsync.WithLockDelay(61 * time.Second)} {
			_, err := k.First(cli, "life-bad-"+k.Name, opt)
			assert.ErrorIs(t, err, core.ErrInvalidOption, k.Name)
		}
	}
}

func leaseOfKey(t *testing.T, cli *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the key %s", key)
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}
