package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// maxChangeCompares bounds the compares of a change's Txn (etcd takes 128 by default):
// with more permits holding, the change compares none, and a permit served in the
// milliseconds between its read and its write may be shown waiting (core.HeldPermits) until it
// is released. Who is served is not affected.
const maxChangeCompares = 100

// changeLimit sets the limit of the semaphore at prefix to n: one Txn writes the record
// and replaces its marker, if the record and the permits that hold are still what a read
// found (else it reads again), so that every waiter hears of it in order with the releases
// (see internal/core, records.go). It records n if etcd records no limit.
func changeLimit(ctx context.Context, cli *clientv3.Client, prefix string, n int) error {
	record, mark := prefix+core.RecordLimit, prefix+core.LimitMark
	claim := core.Claim{Prefix: prefix, Use: core.UseSemaphore}
	var b core.Backoff
	for {
		resp, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(append(core.LimitReads(prefix),
				clientv3.OpGet(prefix+core.KindPermit, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))...).Commit()
		})
		if err != nil {
			return fmt.Errorf("read %s: %w", record, err)
		}
		l, err := core.LimitOf(prefix, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
		if err != nil {
			return err
		}
		if l.N == n && l.Marked {
			return nil
		}
		permits := resp.Responses[2].GetResponseRange().Kvs
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(record), "=", l.Rev)}
		if l.N == 0 {
			cmps = append(cmps, claim.Guard()...) // a new record: on a name of no other use
		}
		var ops []clientv3.Op
		if l.N != 0 && !l.Marked {
			// A record without its marker: mark it first, so that the change has a delete
			// for the waiters to hear. Nobody waits on a marker that is not there yet.
			ops = []clientv3.Op{clientv3.OpPut(mark+strconv.Itoa(l.N), "0")}
		} else {
			// The watermark: the newest permit that holds. Those that hold and the first
			// that waits must still be there when the Txn applies.
			watermark, held := int64(0), core.HeldPermits(prefix, core.KindPermit, permits, l)
			var fence []clientv3.Cmp
			for i, kv := range permits {
				fence = append(fence, clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision))
				if !held[i] {
					break
				}
				watermark = kv.CreateRevision
			}
			if len(fence) <= maxChangeCompares {
				cmps = append(cmps, fence...)
			}
			ops = []clientv3.Op{
				clientv3.OpPut(record, strconv.Itoa(n)),
				clientv3.OpPut(mark+strconv.Itoa(n), strconv.FormatInt(watermark, 10)),
			}
			if l.N != 0 {
				ops = append(ops, clientv3.OpDelete(mark+strconv.Itoa(l.N)))
			}
		}
		for _, k := range l.Stray {
			if k != mark+strconv.Itoa(n) {
				ops = append(ops, clientv3.OpDelete(k))
			}
		}
		tresp, err := core.Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Then(ops...).Commit()
		})
		switch {
		case err != nil && claim.Use != 0 && l.N == 0 && errors.Is(err, rpctypes.ErrPermissionDenied):
			claim = core.Claim{} // a user granted the kind's sub-ranges alone: write without the guard
			continue
		case err != nil:
			return fmt.Errorf("write %s: %w", record, err)
		case tresp.Succeeded && l.N != 0 && !l.Marked:
			continue // marked: now the change
		case tresp.Succeeded:
			return nil
		}
		if l.N == 0 {
			if err := core.Check(ctx, cli, claim); err != nil {
				return err
			}
		}
		if err := core.Pause(ctx, b.Next()); err != nil { // it changed between: read again
			return err
		}
	}
}
