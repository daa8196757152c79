package rwmutex_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// TestRDosNeverFreeAReaderThatCameAfterAnRUnlock: two RDos share the handle's read hold; one
// fn RUnlocks, and a reader then joins that hold. When both RDos return, one release leaves
// the hold and the other does nothing (ErrNotLocked): the later reader still holds, its key
// in etcd, until its own RUnlock.
func TestRDosNeverFreeAReaderThatCameAfterAnRUnlock(t *testing.T) {
	ctx := etcdtest.Context(t)
	const name = "rdo-after-runlock"
	admin := cluster.Client(t)
	rw := newRW(t, cluster.Client(t), name)
	var in, joined sync.WaitGroup
	in.Add(2)
	joined.Add(1)
	fn := func(unlock bool) func(context.Context) error {
		return func(fctx context.Context) error {
			in.Done()
			in.Wait() // both RDos hold through one read key
			if unlock {
				assert.NoError(t, rw.RUnlock(fctx))
				assert.NoError(t, rw.RLock(ctx)) // the later reader
				joined.Done()
			}
			joined.Wait()
			return nil
		}
	}
	errs := []<-chan error{
		etcdtest.Async(func() error { return rw.RDo(ctx, fn(true)) }),
		etcdtest.Async(func() error { return rw.RDo(ctx, fn(false)) }),
	}
	notLocked := 0
	for _, errc := range errs {
		err := etcdtest.Within(t, errc, 20*time.Second, "an RDo's return")
		if err != nil {
			assert.ErrorIs(t, err, core.ErrNotLocked)
			notLocked++
		}
	}
	assert.Equal(t, 1, notLocked, "one RDo's release had nothing left to leave")
	assert.NoError(t, rw.Err(), "the RDos' releases ended the later reader's hold")
	assert.Equal(t, int64(1), etcdtest.CountKeys(t, admin, core.NamePrefix(name)))
	require.NoError(t, rw.RUnlock(ctx))
	assert.Zero(t, etcdtest.CountKeys(t, admin, core.NamePrefix(name)))
}
