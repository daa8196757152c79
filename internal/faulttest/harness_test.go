package faulttest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/faulttest"
)

// TestBlackholedClientIsCutOffAndRestored checks the per-client proxy: a black-holed
// client's requests fail and its lease is not renewed; restored, it works again.
func TestBlackholedClientIsCutOffAndRestored(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	env := faulttest.NewEnv(t)
	cli := env.Client(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := cli.Put(ctx, "blackhole/before", "1")
	require.NoError(t, err)
	lease, err := cli.Grant(ctx, 2)
	require.NoError(t, err)
	keepAlive, err := cli.KeepAlive(ctx, lease.ID)
	require.NoError(t, err)

	cli.Blackhole()
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = cli.Get(rctx, "blackhole/before")
	rcancel()
	require.Error(t, err, "a read through the black-holed client")
	for range keepAlive { // the keep-alive channel closes once the lease has expired
	}
	ttl, err := env.Admin.TimeToLive(ctx, lease.ID)
	require.NoError(t, err)
	assert.EqualValues(t, -1, ttl.TTL, "the lease of the black-holed client expired")

	cli.Restore()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := cli.Get(rctx, "blackhole/before")
		rcancel()
		if err == nil {
			require.Len(t, resp.Kvs, 1)
			break
		}
		require.NoError(t, ctx.Err(), "the restored client never read again: %v", err)
	}
}

// errLost is the brokenLock's loss.
var errLost = errors.New("broken lock: lost")

// brokenLock takes "the lock" by writing a key and never waits: every worker holds at once.
type brokenLock struct {
	cli *clientv3.Client
	key string
	rev int64
}

func (b *brokenLock) Lock(ctx context.Context) error {
	resp, err := b.cli.Put(ctx, b.key, "")
	if err != nil {
		return err
	}
	b.rev = resp.Header.Revision
	return nil
}

func (b *brokenLock) Unlock(ctx context.Context) error {
	resp, err := b.cli.Txn(ctx).If(b.IsOwner()).Then(clientv3.OpDelete(b.key)).Commit()
	if err == nil && !resp.Succeeded {
		err = errLost
	}
	return err
}

func (b *brokenLock) Token() int64 { return b.rev }

func (b *brokenLock) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(b.key), "=", b.rev)
}

// TestChecksCatchALockThatDoesNotExclude runs a lock that lets everyone in at once, without
// faults: the checks must report overlapping holds and a history that is not linearizable.
func TestChecksCatchALockThatDoesNotExclude(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	env := faulttest.NewEnv(t)
	workers := 0
	r := env.Start(t, faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			workers++
			return &brokenLock{cli: cli, key: name + "/" + string(rune('a'+workers))}, nil
		},
		Prefix: func(name string) string { return name + "/" },
		TTL:    time.Second,
		Lost:   errLost,
	}, "broken")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ops := 0
	_, err := r.History().Await(ctx, func(faulttest.Op) bool { ops++; return ops > 200 })
	require.NoError(t, err)
	r.Stop()
	summary, violations, err := r.Verify(t.TempDir())
	require.NoError(t, err)
	t.Log(summary)
	all := strings.Join(violations, "\n")
	assert.Contains(t, all, "holds released cleanly overlap")
	assert.Contains(t, all, "not linearizable")
}
