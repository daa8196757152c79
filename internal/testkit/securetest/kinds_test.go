package securetest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// served bounds every wait that must end: generous, since a failing test then only takes longer.
const served = 20 * time.Second

// refusedWithin bounds a call that etcd refuses: it must fail at once, not after retries.
const refusedWithin = 5 * time.Second

// busy reports whether err is a try's answer that the lock is taken.
func busy(err error) bool { return errors.Is(err, core.ErrLocked) || errors.Is(err, core.ErrNoPermits) }

// side is a contender's client and the options of its handle.
type side struct {
	cli  *clientv3.Client
	opts []core.Option
}

// contend has a and b contend for name through k: first (on a) takes it; second (on b) finds
// it busy, waits while first holds, and is served once first lets go, with a higher token.
// keys is where name's keys live, as the root client admin sees them; at the end none is
// left there but a semaphore's limit record.
func contend(t *testing.T, k primtest.Kind, a, b side, admin *clientv3.Client, name, keys string) {
	t.Helper()
	ctx := etcdtest.Context(t)
	first, second := k.First.Make(t, a.cli, name, a.opts...), k.Second.Make(t, b.cli, name, b.opts...)
	require.NoError(t, first.Lock(ctx))
	if err := second.TryLock(ctx); !errors.Is(err, primtest.ErrNoTry) {
		require.True(t, busy(err), "a try while first holds: %v", err)
	}
	held := count(t, admin, keys)
	require.Positive(t, held, "first holds, but no key is under %q", keys)

	secondDone := etcdtest.Async(func() error { return second.Lock(ctx) })
	if k.InLine {
		etcdtest.AwaitKeys(t, admin, keys, held+1)
	}
	select {
	case err := <-secondDone:
		t.Fatalf("second served while first holds: %v", err)
	default:
	}
	firstToken := first.Token()
	require.NoError(t, first.Unlock(ctx))
	require.NoError(t, etcdtest.Within(t, secondDone, served, "second served after first let go"))
	if !k.Reads {
		assert.Greater(t, second.Token(), firstToken, "tokens rise")
	}
	require.NoError(t, second.Unlock(ctx))
	assertNoLockKeys(t, admin, keys)
}

// count is the number of keys under prefix.
func count(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Count
}

// assertNoLockKeys checks that prefix, a name's keys, holds no key but a semaphore's limit
// record and marker, which outlive every holder by design.
func assertNoLockKeys(t *testing.T, cli *clientv3.Client, prefix string) {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	for _, kv := range resp.Kvs {
		if !core.IsRecord(strings.TrimPrefix(string(kv.Key), prefix)) {
			t.Errorf("key %s left", kv.Key)
		}
	}
}
