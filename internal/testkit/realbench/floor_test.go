package realbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/core"
)

// BenchmarkFleetDrainFloor is BenchmarkFleetDrain with, on our side, no library: the
// bare requests of a hand-off that reads nothing of the name (issue 55's question: what a
// hand-off with one commit and one event costs against etcd's Mutex, on the same server,
// before the library is built around it). Each waiter of a chaseLock watches its
// predecessor's key alone; a key that never held is marked (its value overwritten)
// before it is deleted, so an unmarked delete of a key whose lease is still alive can only
// be a release: the waiter takes the lock on it after one LeaseTimeToLive, with no read of
// the name. Anything else (a mark, a lease gone) sends it back to read its predecessor
// anew. A hand-off is thus the release's fenced delete (one commit), one watch event, one
// LeaseTimeToLive and the waiter's watch cancelled. The rival is etcd's concurrency.Mutex,
// as in BenchmarkFleetDrain.
//
// It measures a protocol, not something the library does: no guard of the name's use, no
// hub, no loss watched. A delete by anyone who does not keep the rule (etcdctl del, a
// foreign client) would be taken for a release; the library's waiters read instead.
func BenchmarkFleetDrainFloor(b *testing.B) {
	sizes := slices.Concat(fleetSizes, fleetExtra(b))
	forEachCluster(b, func(b *testing.B, t *target) {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
				fleetVsEtcd(b, t, n, floorName,
					func(_ int, cli *clientv3.Client, prefix string) (exclusive, error) {
						s, err := concurrency.NewSession(cli)
						if err != nil {
							return nil, err
						}
						b.Cleanup(func() { s.Close() })
						return &chaseLock{s: s, prefix: prefix + core.NamePrefix(floorName)}, nil
					},
					func(_ int, s *concurrency.Session, name string) exclusive { return concurrency.NewMutex(s, name) })
			})
		}
	})
}

const floorName = "floor"

// The values of a chaseLock's key: a waiter's or holder's, and one that will be deleted
// without having held.
const (
	chaseValue = "chase"
	chaseMark  = "chase withdrawn"
)

// A chaseLock is one session's lock of the floor's protocol (see BenchmarkFleetDrainFloor):
// its key is the prefix and its lease in hex; the lock is held by the key of the lowest
// create revision under the prefix.
type chaseLock struct {
	s      *concurrency.Session
	prefix string
	key    string
	rev    int64 // the key's create revision while it is there
}

func (l *chaseLock) Lock(ctx context.Context) error {
	cli := l.s.Client()
	l.key = fmt.Sprintf("%s%x", l.prefix, l.s.Lease())
	put, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)).
		Then(clientv3.OpPut(l.key, chaseValue, clientv3.WithLease(l.s.Lease()))).Commit()
	if err != nil {
		return err
	}
	if !put.Succeeded {
		return fmt.Errorf("chaseLock: %s is there already", l.key)
	}
	l.rev = put.Header.Revision
	if err := l.await(ctx); err != nil {
		l.withdraw()
		return err
	}
	return nil
}

// await returns once nothing is ahead of l's key.
func (l *chaseLock) await(ctx context.Context) error {
	cli := l.s.Client()
	for {
		ahead, err := cli.Get(ctx, l.prefix, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(l.rev-1))...)
		if err != nil {
			return err
		}
		if len(ahead.Kvs) == 0 {
			return nil
		}
		pred := ahead.Kvs[0]
		released, err := l.chase(ctx, pred, ahead.Header.Revision)
		if err != nil || released {
			return err
		}
	}
}

// chase watches pred from after rev until it is deleted, and reports whether the delete
// was a release: the last value heard unmarked and written by a chaseLock, its lease alive.
func (l *chaseLock) chase(ctx context.Context, pred *mvccpb.KeyValue, rev int64) (bool, error) {
	cli := l.s.Client()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	value := string(pred.Value)
	for resp := range cli.Watch(wctx, string(pred.Key), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return false, err
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.PUT {
				value = string(ev.Kv.Value)
				continue
			}
			if value != chaseValue {
				return false, nil
			}
			ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(pred.Lease))
			if err != nil {
				return false, err
			}
			return ttl.TTL > 0, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return false, errors.New("chaseLock: the watch ended")
}

// withdraw marks l's key, then deletes it, each fenced on its create revision.
func (l *chaseLock) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mine := clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)
	cli := l.s.Client()
	_, _ = cli.Txn(ctx).If(mine).Then(clientv3.OpPut(l.key, chaseMark, clientv3.WithIgnoreLease())).Commit()
	_, _ = cli.Txn(ctx).If(mine).Then(clientv3.OpDelete(l.key)).Commit()
}

// Unlock is the release: one delete, fenced on the key's create revision.
func (l *chaseLock) Unlock(ctx context.Context) error {
	resp, err := l.s.Client().Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)).
		Then(clientv3.OpDelete(l.key)).Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("chaseLock: %s was not held", l.key)
	}
	return err
}
