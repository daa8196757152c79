package primtest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/internal/testkit/rpcstat"
)

// TestBadInputIsRejectedAndWritesNothing: New of every package refuses a bad name, a bad
// option and a nil client with ErrInvalidName or ErrInvalidOption and a nil handle; a handle
// without a hold says so from Unlock and Err; none of it writes to etcd.
func TestBadInputIsRejectedAndWritesNothing(t *testing.T) {
	cli := cluster.Client(t)
	sess, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer sess.Close()
	before := etcdtest.Revision(t, cli)
	tested := map[string]bool{}
	for _, k := range primtest.Kinds {
		if !tested[k.Package] {
			tested[k.Package] = true
			t.Run(k.Package, func(t *testing.T) { newRefusesBadInput(t, k, cli, sess) })
		}
		t.Run(k.Name+"/no hold", func(t *testing.T) {
			ctx := etcdtest.Context(t)
			l := k.Second.Make(t, cli, strings.Repeat("x", 512), k.WithTTL(time.Second))
			assert.ErrorIs(t, l.Unlock(ctx), k.NotHeld)
			assert.ErrorIs(t, l.Err(), k.NotHeld)
			assert.Zero(t, l.Token())
			assert.Empty(t, l.Key())
		})
	}
	etcdtest.NoWrites(t, cli, before, "bad input wrote to etcd")
}

func newRefusesBadInput(t *testing.T, k primtest.Kind, cli *clientv3.Client, sess *concurrency.Session) {
	for _, tc := range []struct {
		desc string
		cli  *clientv3.Client
		name string
		opts []core.Option
		want error
	}{
		{"empty name", cli, "", nil, core.ErrInvalidName},
		{"NUL in name", cli, "a\x00b", nil, core.ErrInvalidName},
		{"name over 512 bytes", cli, strings.Repeat("x", 513), nil, core.ErrInvalidName},
		{"name not UTF-8", cli, "\xff", nil, core.ErrInvalidName},
		{"name not UTF-8 inside", cli, "a\xffb", nil, core.ErrInvalidName},
		{"TTL under a second", cli, "ok", []core.Option{k.WithTTL(500 * time.Millisecond)}, core.ErrInvalidOption},
		{"negative TTL", cli, "ok", []core.Option{k.WithTTL(-time.Second)}, core.ErrInvalidOption},
		{"nil session", cli, "ok", []core.Option{k.WithSession(nil)}, core.ErrInvalidOption},
		{"TTL and session", cli, "ok", []core.Option{k.WithTTL(time.Minute), k.WithSession(sess)}, core.ErrInvalidOption},
		{"nil option", cli, "ok", []core.Option{nil}, core.ErrInvalidOption},
		{"prefix without a trailing slash", cli, "ok", []core.Option{k.WithPrefix("app")}, core.ErrInvalidOption},
		{"empty prefix", cli, "ok", []core.Option{k.WithPrefix("")}, core.ErrInvalidOption},
		{"prefix with NUL", cli, "ok", []core.Option{k.WithPrefix("a\x00/")}, core.ErrInvalidOption},
		{"nil client", nil, "ok", nil, core.ErrInvalidOption},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			l, err := k.First(tc.cli, tc.name, tc.opts...)
			assert.ErrorIs(t, err, tc.want)
			assert.Nil(t, l)
		})
	}
}

// TestCancelledWaitReturnsContextErrorAndLeavesNoKey: a wait whose ctx is cancelled, or
// whose deadline passes, returns ctx's error promptly and deletes its key before it returns.
// (trylock.Retry waits with no key: see trylock's TestRetryReturnsPromptlyWhenCtxIsCancelled.)
func TestCancelledWaitReturnsContextErrorAndLeavesNoKey(t *testing.T) {
	for _, k := range primtest.Kinds {
		if !k.InLine {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			c := hold(ctx, t, k, "cancel", primtest.Locker.Lock)
			second := c.second()
			wctx, cancel := context.WithCancel(ctx)
			errc := etcdtest.Async(func() error { return second.Lock(wctx) })
			c.awaitWaiters(1)
			if k.KeyWhileWaiting {
				assert.NotEmpty(t, second.Key(), "the waiter's key")
			}
			cancel()
			assert.ErrorIs(t, etcdtest.Within(t, errc, 10*time.Second, "a cancelled wait returns"), context.Canceled)
			assert.Equal(t, c.held, c.keys(), "the cancelled waiter's key is left")
			assert.Empty(t, second.Key())
			assert.ErrorIs(t, second.Err(), k.NotHeld)
			assert.Zero(t, second.Token())

			dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer dcancel()
			assert.ErrorIs(t, second.Lock(dctx), context.DeadlineExceeded)
			assert.Equal(t, c.held, c.keys(), "the timed-out waiter's key is left")
			require.NoError(t, c.first.Unlock(ctx))
			assert.Zero(t, c.keys())
		})
	}
}

// TestAWaitWithADoneContextSendsNothing: Lock and TryLock with a ctx that has ended return
// its error without an RPC, also when the handle's turn is free (a select must not pick it).
func TestAWaitWithADoneContextSendsNothing(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			cnt := &rpcstat.Counter{}
			l := k.Second.Make(t, primtest.CountedClient(t, cluster, cnt), "done-context-"+k.Name)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			for range 20 {
				assert.ErrorIs(t, l.Lock(ctx), context.Canceled)
				if k.Busy != nil {
					assert.ErrorIs(t, l.TryLock(ctx), context.Canceled)
				}
			}
			assert.Empty(t, cnt.Counts(), "RPCs sent for a done context")
		})
	}
}

// TestAFailedTryReturnsAtOnceAndWritesNothing: a try while another holds answers Busy at
// once, writes nothing (one Txn that compares, where etcd's TryLock writes and deletes), and
// leaves the handle without a hold; once the holder lets go, the try takes it.
func TestAFailedTryReturnsAtOnceAndWritesNothing(t *testing.T) {
	for _, k := range primtest.Kinds {
		if k.Busy == nil {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			c := hold(ctx, t, k, "try", primtest.Locker.TryLock)
			second := c.second()
			before := etcdtest.Revision(t, c.admin)
			start := time.Now()
			assert.ErrorIs(t, second.TryLock(ctx), k.Busy)
			assert.Less(t, time.Since(start), 5*time.Second, "the try waited")
			etcdtest.NoWrites(t, c.admin, before, "a failed try wrote")
			assert.Equal(t, c.held, c.keys())
			assert.ErrorIs(t, second.Err(), k.NotHeld)
			assert.Zero(t, second.Token())
			assert.Empty(t, second.Key())

			require.NoError(t, c.first.Unlock(ctx))
			require.NoError(t, second.TryLock(ctx))
			require.NoError(t, second.Unlock(ctx))
			assert.Zero(t, c.keys())
		})
	}
}

// TestIsOwnerFencesWritesOnlyWhileHeld: a Txn under IsOwner succeeds while the hold lasts,
// and neither before nor after it; a read hold never fences.
func TestIsOwnerFencesWritesOnlyWhileHeld(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			cli := cluster.Client(t)
			l := k.Second.Make(t, cli, "owner-"+k.Name)
			data := "owner-data-" + k.Name
			fencedPut := func(v string) bool {
				resp, err := cli.Txn(ctx).If(l.IsOwner()).Then(clientv3.OpPut(data, v)).Commit()
				require.NoError(t, err)
				return resp.Succeeded
			}
			assert.False(t, fencedPut("before"), "IsOwner held before Lock")
			require.NoError(t, l.Lock(ctx))
			assert.Equal(t, !k.Reads, fencedPut("held"), "IsOwner while held")
			require.NoError(t, l.Unlock(ctx))
			assert.False(t, fencedPut("after"), "IsOwner held after Unlock")
			resp, err := cli.Get(ctx, data)
			require.NoError(t, err)
			if !k.Reads {
				require.Len(t, resp.Kvs, 1)
				assert.Equal(t, "held", string(resp.Kvs[0].Value))
			} else {
				assert.Empty(t, resp.Kvs)
			}
		})
	}
}

// TestTokensIncreaseAcrossHolders: each hold's token is above the one before it, whichever
// handle holds; without a hold it is 0.
func TestTokensIncreaseAcrossHolders(t *testing.T) {
	for _, k := range primtest.Kinds {
		if k.Reads {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			name := "tokens-" + k.Name
			handles := []primtest.Locker{k.Second.Make(t, cluster.Client(t), name), k.Second.Make(t, cluster.Client(t), name)}
			var last int64
			for i := range 6 {
				l := handles[i%2]
				require.NoError(t, l.Lock(ctx))
				assert.Greater(t, l.Token(), last)
				last = l.Token()
				require.NoError(t, l.Unlock(ctx))
				assert.Zero(t, l.Token())
			}
		})
	}
}

// TestWaitersAreServedInArrivalOrder: waiters queued one after another while First holds
// are served in that order once it lets go. Each has a client of its own, and there are
// more than a waiter joins its client's watch of the name with (core's nearAhead): the last
// ones approach first.
func TestWaitersAreServedInArrivalOrder(t *testing.T) {
	for _, k := range primtest.Kinds {
		if !k.InLine || k.Reads {
			continue // trylock has no line; readers are served together
		}
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			c := hold(ctx, t, k, "fifo", primtest.Locker.Lock)
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			const waiters = 8
			for i := range waiters {
				l := c.second()
				wg.Go(func() {
					if !assert.NoError(t, l.Lock(ctx)) {
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					assert.NoError(t, l.Unlock(ctx))
				})
				c.awaitWaiters(int64(i) + 1) // waiter i is in line before i+1 starts
			}
			require.NoError(t, c.first.Unlock(ctx))
			wg.Wait()
			for i, got := range order {
				assert.Equal(t, i, got, "served in the order %v", order)
			}
			assert.Len(t, order, waiters)
			assert.Zero(t, c.keys())
		})
	}
}

// TestNestedNamesAreIndependent: names that are prefixes of one another, or that look like
// another name's keys (an rwmutex's kinds, a semaphore's permits and limit record), never
// see each other's keys: each is held at once, with one key of its own.
func TestNestedNamesAreIndependent(t *testing.T) {
	suffixes := []string{"", "/b", "b", "/", "%2Fb", "/read", "/write", "/permit", "/limit", "%2Fwrite"}
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			cli := cluster.Client(t)
			base := "nested-" + k.Name
			var held []primtest.Locker
			for _, suffix := range suffixes {
				l := k.First.Make(t, cli, base+suffix)
				lock := etcdtest.Async(func() error { return l.Lock(ctx) })
				require.NoError(t, etcdtest.Within(t, lock, 5*time.Second, "Lock of "+base+suffix+" (blocked by another name?)"))
				held = append(held, l)
			}
			for i, l := range held {
				assert.Equal(t, int64(1), etcdtest.CountKeys(t, cli, k.Keys(base+suffixes[i])), "name %q sees another's key", base+suffixes[i])
				require.NoError(t, l.Unlock(ctx))
			}
		})
	}
}

// TestUnlockWhoseContextEndsMidwayIsRetriedCleanly: an Unlock whose ctx ends while its
// fenced delete is in flight may be told to try again; the retry then reports a release,
// not a loss, also when the delete had been applied and the hold's watch saw the key go.
func TestUnlockWhoseContextEndsMidwayIsRetriedCleanly(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			name := "unlock-timeout-" + k.Name
			admin := cluster.Client(t)
			l := k.Second.Make(t, cluster.Client(t), name)
			retried := 0
			for i := range 100 {
				require.NoError(t, l.Lock(ctx))
				done := l.Done() // the watch that sees the key go
				uctx, cancel := context.WithTimeout(ctx, time.Duration(i%50)*100*time.Microsecond)
				err := l.Unlock(uctx)
				cancel()
				if err != nil {
					// The deadline, or etcd's "request timed out" for a request that carried it.
					require.NotErrorIs(t, err, core.ErrLost, "iteration %d", i)
					retried++
					require.NoError(t, l.Unlock(ctx), "iteration %d: the retry", i)
				}
				etcdtest.Within(t, done, 5*time.Second, "Done after Unlock")
				require.ErrorIs(t, l.Unlock(ctx), k.NotHeld, "iteration %d", i)
				require.Zero(t, etcdtest.CountKeys(t, admin, k.Keys(name)), "iteration %d", i)
			}
			t.Logf("%d of 100 Unlocks timed out and were retried", retried)
		})
	}
}

// TestARevokedLeaseEndsTheHoldAndServesTheNext: once the holder's lease is revoked, its
// Done closes and Err says ErrLost, the waiter is served, the lost holder's Unlock says
// ErrLost and leaves the new hold alone, and its next Lock takes a new lease.
func TestARevokedLeaseEndsTheHoldAndServesTheNext(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			c := hold(ctx, t, k, "revoked", primtest.Locker.Lock)
			first := c.first
			done := first.Done()
			assert.NoError(t, first.Err())

			second := c.second()
			served := etcdtest.Async(func() error { return second.Lock(ctx) })
			if k.InLine {
				c.awaitWaiters(1)
			}
			resp, err := c.admin.Get(ctx, first.Key())
			require.NoError(t, err)
			require.Len(t, resp.Kvs, 1)
			_, err = c.admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
			require.NoError(t, err)

			etcdtest.Within(t, done, 5*time.Second, "Done closes after the lease is revoked")
			assert.ErrorIs(t, first.Err(), core.ErrLost)
			require.NoError(t, etcdtest.Within(t, served, 5*time.Second, "the next waiter is served"))
			assert.NoError(t, second.Err())

			assert.ErrorIs(t, first.Unlock(ctx), core.ErrLost)
			assert.ErrorIs(t, first.Err(), k.NotHeld)
			assert.Equal(t, c.held, c.keys(), "a lost hold's Unlock touched the new one")
			relocked := etcdtest.Async(func() error { return first.Lock(ctx) })
			require.NoError(t, second.Unlock(ctx))
			require.NoError(t, etcdtest.Within(t, relocked, 10*time.Second, "Lock after a loss"))
			require.NoError(t, first.Unlock(ctx))
			assert.Zero(t, c.keys())
		})
	}
}
