package misusetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestShutdownEndsEveryHoldAtOnce: after Shutdown under a hold, Done is closed and Err is
// ErrLost at once; the release returns ErrLost at once, with no etcd round trip to wait
// for; and the next acquisition on the same client takes a new lease.
func TestShutdownEndsEveryHoldAtOnce(t *testing.T) {
	for _, k := range holdKinds {
		t.Run(k.name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			cli, admin := cluster.Client(t), cluster.Client(t)
			name := "misuse-shutdown-" + k.name
			h := k.take(t, ctx, cli, name)
			require.NoError(t, k.shutdown(ctx, cli))
			etcdtest.Within(t, h.done(), prompt, "Done after Shutdown")
			assert.ErrorIs(t, h.err(), core.ErrLost)
			assert.ErrorIs(t, etcdtest.Within(t, etcdtest.Async(func() error { return h.release(ctx) }), prompt, "release after Shutdown"), core.ErrLost)

			again := k.take(t, ctx, cli, name)
			require.NoError(t, again.release(ctx))
			assert.Zero(t, etcdtest.CountKeys(t, admin, k.prefix(name)), "keys left")
		})
	}
}

// TestAClosedClientEndsEveryHold: a release through a client closed under the hold cannot
// reach etcd, now or ever: it returns ErrLost within a second, even with a context that
// never ends, and Done closes. The key goes with the lease, which nobody renews.
func TestAClosedClientEndsEveryHold(t *testing.T) {
	for _, k := range holdKinds {
		t.Run(k.name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			cli, err := cluster.NewClient()
			require.NoError(t, err)
			h := k.take(t, ctx, cli, "misuse-closed-hold-"+k.name)
			require.NoError(t, cli.Close())
			start := time.Now()
			err = etcdtest.Within(t, etcdtest.Async(func() error { return h.release(context.Background()) }), prompt+time.Second, "release after the client closed")
			t.Logf("release: %v after %v", err, time.Since(start).Round(time.Millisecond))
			assert.ErrorIs(t, err, core.ErrLost)
			assert.True(t, closed(h.done()), "Done closed")
		})
	}
}
