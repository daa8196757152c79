package faulttest_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
	"github.com/etcdsync/etcdsync/mutex"
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

// exclusiveReader is a Reader over a mutex: every read hold is exclusive, so it never
// overlaps a writer nor another reader, a degenerate but valid readers/writer lock. The
// readers sharing it take turns, as a Mutex handle has one hold at a time.
type exclusiveReader struct {
	turn chan struct{} // one slot, taken from RLock until RUnlock says how the hold ended
	m    *mutex.Mutex
}

func (e *exclusiveReader) RLock(ctx context.Context) error {
	select {
	case e.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := e.m.Lock(ctx); err != nil {
		<-e.turn
		return err
	}
	return nil
}

func (e *exclusiveReader) RUnlock(ctx context.Context) error {
	err := e.m.Unlock(ctx)
	if err == nil || errors.Is(err, mutex.ErrLost) {
		<-e.turn
	}
	return err
}

// readerTTL is short, so that a holder cut off by a fault frees the lock soon.
const readerTTL = 2 * time.Second

// mutexWithReaders is the mutex's workload with exclusiveReaders on the same name.
func mutexWithReaders() faulttest.Workload {
	return faulttest.Workload{
		Open: func(cli *clientv3.Client, name string) (faulttest.Locker, error) {
			return mutex.New(cli, name, mutex.WithTTL(readerTTL))
		},
		OpenReader: func(cli *clientv3.Client, name string) (faulttest.Reader, error) {
			m, err := mutex.New(cli, name, mutex.WithTTL(readerTTL))
			if err != nil {
				return nil, err
			}
			return &exclusiveReader{turn: make(chan struct{}, 1), m: m}, nil
		},
		Prefix: core.NamePrefix,
		TTL:    readerTTL,
		Lost:   mutex.ErrLost,
	}
}

// TestReadersRunBesideWriters runs readers, several per handle, beside the writers without
// faults: every reader is served again and again, and the checks pass and count the read
// holds.
func TestReadersRunBesideWriters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	env := faulttest.NewEnv(t)
	r := env.Start(t, mutexWithReaders(), "readers")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	readers := map[int]int{}
	writes := 0
	_, err := r.History().Await(ctx, func(op faulttest.Op) bool {
		switch op.Kind {
		case faulttest.ReadAcquire:
			readers[op.Worker]++
		case faulttest.Write:
			writes++
		}
		return len(readers) == 4 && writes >= 20 && slices.Min(slices.Collect(maps.Values(readers))) >= 3
	})
	require.NoError(t, err, "read holds by worker %v, %d writes", readers, writes)
	r.Stop()
	summary, violations, err := r.Verify(t.TempDir())
	require.NoError(t, err)
	t.Log(summary)
	assert.Empty(t, violations)
	assert.Contains(t, summary, "read holds; read releases:")
}

// TestReadersThroughAFault runs readers and writers through a fault as Suite does: a
// reader too must be served after it heals.
func TestReadersThroughAFault(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	env := faulttest.NewEnv(t)
	i := slices.IndexFunc(faulttest.Faults(), func(f faulttest.Fault) bool { return f.Name == "leader partitioned" })
	require.GreaterOrEqual(t, i, 0)
	faulttest.RunFault(t, env, mutexWithReaders(), "readers-fault", faulttest.Faults()[i], 10)
}

// eagerReader never waits and writes no key: its read holds overlap every writer.
type eagerReader struct{}

func (eagerReader) RLock(context.Context) error   { return nil }
func (eagerReader) RUnlock(context.Context) error { return nil }

// TestChecksCatchAReaderThatDoesNotWait runs a reader that ignores the writers, without
// faults: the checks must report read holds overlapping write holds.
func TestChecksCatchAReaderThatDoesNotWait(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	env := faulttest.NewEnv(t)
	w := mutexWithReaders()
	w.OpenReader = func(*clientv3.Client, string) (faulttest.Reader, error) { return eagerReader{}, nil }
	r := env.Start(t, w, "eager")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	writes := 0
	_, err := r.History().Await(ctx, func(op faulttest.Op) bool {
		if op.Kind == faulttest.Write {
			writes++
		}
		return writes >= 20
	})
	require.NoError(t, err)
	r.Stop()
	summary, violations, err := r.Verify(t.TempDir())
	require.NoError(t, err)
	t.Log(summary)
	all := strings.Join(violations, "\n")
	assert.Contains(t, all, "read hold released cleanly overlaps")
	assert.NotContains(t, all, "holds released cleanly overlap (", "the writers still exclude one another")
	assert.NotContains(t, all, "not linearizable", "reads are not in the model")
}
