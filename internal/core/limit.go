package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A semaphore's limit lives in etcd beside its permits, in two keys without a lease: the
// record (RecordLimit), whose value is the limit and which every write of a permit compares
// (Spec.Guard), and its marker, "<LimitMark><n>", whose name says the same limit. A change
// (ChangeLimit) writes the record and replaces the marker in one Txn. Waiters hear deletes
// only, so the marker's delete is what tells them, in order with the releases, that the
// limit changed; its successor's name, which a keys-only read of the name returns, says to
// what (Spec.CapacityMark, queueWaiter.recount). A waiter that approaches watches the marker
// too. A record written by a version without markers gets its marker before its first
// change, by a put no waiter needs to hear.
//
// Who holds is then no longer a matter of the present keys alone: after a lowering, the
// permits that held keep holding, beyond what the new limit would serve. The marker's value
// says through which create revision the permits held when it was written (its watermark):
// a permit holds if it was created at or before it, or if its units fit beside those ahead
// of it under the limit (heldPermits). The change reads the permits and compares, in its
// Txn, that those that held and the first that waited are still there, so that nobody was
// served under the old limit between its read and its write.

// MaxUnits is the highest limit of a semaphore, and so the most units one permit takes:
// the units of a permit are in its key (see unitsKind), read back as a 32-bit number, and
// the units of every key ahead of a waiter are summed in an int, which no count of keys
// etcd can hold makes overflow on a 64-bit platform.
const MaxUnits = 1<<31 - 1

// CheckLimit reports, wrapped around ErrInvalidOption, why n cannot be a semaphore's limit.
func CheckLimit(n int) error {
	switch {
	case n < 1:
		return fmt.Errorf("%w: limit %d is below 1", ErrInvalidOption, n)
	case n > MaxUnits:
		return fmt.Errorf("%w: limit %d is over the most units a semaphore counts, %d", ErrInvalidOption, n, MaxUnits)
	}
	return nil
}

// LimitMark starts the key of a limit's marker under the name's prefix.
const LimitMark = RecordLimit + "/"

// IsRecord reports whether rest, a key relative to its name's prefix, is a record of the
// name (a semaphore's limit or its marker), not a holder's or waiter's key.
func IsRecord(rest string) bool {
	return rest == RecordLimit || strings.HasPrefix(rest, LimitMark)
}

// markedLimit is the limit a marker's key names, relative to the mark's range (the name's
// prefix and LimitMark); false if it names none.
func markedLimit(rest string) (int, bool) {
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 1 && n <= MaxUnits && strconv.Itoa(n) == rest
}

// limitState is what etcd records of a semaphore's limit.
type limitState struct {
	n      int      // the limit; 0 without a record
	rev    int64    // the record's mod revision; 0 without a record
	marked bool     // its marker is there
	held   int64    // the marker's watermark (see above)
	stray  []string // other markers (an operator's: ours are replaced in one Txn)
}

// limitOf is the limitState that record (zero or one key) and markers, read together with
// their values, say.
func limitOf(prefix string, record, markers []*mvccpb.KeyValue) (limitState, error) {
	var l limitState
	if len(record) > 0 {
		n, ok := markedLimit(string(record[0].Value))
		if !ok {
			return limitState{}, fmt.Errorf("%w: %s records %q, not a limit", ErrLimitMismatch, prefix+RecordLimit, record[0].Value)
		}
		l.n, l.rev = n, record[0].ModRevision
	}
	for _, kv := range markers {
		if n, ok := markedLimit(strings.TrimPrefix(string(kv.Key), prefix+LimitMark)); ok && n == l.n {
			l.marked = true
			l.held, _ = strconv.ParseInt(string(kv.Value), 10, 64)
		} else {
			l.stray = append(l.stray, string(kv.Key))
		}
	}
	return l, nil
}

// limitReads are the ops that read a semaphore's limit: its record and its markers.
func limitReads(prefix string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(prefix + RecordLimit), clientv3.OpGet(prefix+LimitMark, clientv3.WithPrefix())}
}

// ReadLimit is the limit etcd records for the semaphore at prefix; 0 for none. One
// linearizable Txn, retried through leader changes.
func ReadLimit(ctx context.Context, cli *clientv3.Client, prefix string) (int, error) {
	resp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(limitReads(prefix)...).Commit()
	})
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", prefix+RecordLimit, err)
	}
	l, err := limitOf(prefix, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
	return l.n, err
}

// heldPermits reports which of kvs, the permit keys of a semaphore under prefix+kind in
// create-revision order, hold under l (see above).
func heldPermits(prefix, kind string, kvs []*mvccpb.KeyValue, l limitState) []bool {
	w := weigher{units: prefix + kind + unitsMark}
	held := make([]bool, len(kvs))
	ahead := 0
	for i, kv := range kvs {
		units := w.of(string(kv.Key))
		if held[i] = kv.CreateRevision <= l.held || ahead+units <= l.n; !held[i] {
			break // the permits that hold are always the oldest
		}
		ahead += units
	}
	return held
}

// EnsureLimit records limit n for the semaphore at prefix, with its marker, unless etcd
// records one already, and returns the limit recorded then: n, or what another handle
// recorded first. One Txn, retried through leader changes.
func EnsureLimit(ctx context.Context, cli *clientv3.Client, prefix string, n int) (int, error) {
	record := prefix + RecordLimit
	stored, err := Record(ctx, cli, Claim{prefix, UseSemaphore}, record, strconv.Itoa(n), clientv3.OpPut(prefix+LimitMark+strconv.Itoa(n), "0"))
	if err != nil {
		return 0, err
	}
	got, ok := markedLimit(stored)
	if !ok {
		return 0, fmt.Errorf("%w: %s records %q, not a limit", ErrLimitMismatch, record, stored)
	}
	return got, nil
}

// maxChangeCompares bounds the compares of a change's Txn (etcd takes 128 by default):
// with more permits holding, the change compares none, and a permit served in the
// milliseconds between its read and its write may be shown waiting (heldPermits) until it
// is released. Who is served is not affected.
const maxChangeCompares = 100

// ChangeLimit sets the limit of the semaphore at prefix to n: one Txn writes the record
// and replaces its marker, if the record and the permits that hold are still what a read
// found (else it reads again), so that every waiter hears of it in order with the releases
// (see above). It records n if etcd records no limit.
func ChangeLimit(ctx context.Context, cli *clientv3.Client, prefix string, n int) error {
	record, mark := prefix+RecordLimit, prefix+LimitMark
	claim := Claim{prefix, UseSemaphore}
	var b Backoff
	for {
		resp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(append(limitReads(prefix),
				clientv3.OpGet(prefix+KindPermit, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))...).Commit()
		})
		if err != nil {
			return fmt.Errorf("read %s: %w", record, err)
		}
		l, err := limitOf(prefix, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
		if err != nil {
			return err
		}
		if l.n == n && l.marked {
			return nil
		}
		permits := resp.Responses[2].GetResponseRange().Kvs
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(record), "=", l.rev)}
		if l.n == 0 {
			cmps = append(cmps, claim.Guard()...) // a new record: on a name of no other use
		}
		var ops []clientv3.Op
		if l.n != 0 && !l.marked {
			// A record without its marker: mark it first, so that the change has a delete
			// for the waiters to hear. Nobody waits on a marker that is not there yet.
			ops = []clientv3.Op{clientv3.OpPut(mark+strconv.Itoa(l.n), "0")}
		} else {
			// The watermark: the newest permit that holds. Those that hold and the first
			// that waits must still be there when the Txn applies.
			watermark, held := int64(0), heldPermits(prefix, KindPermit, permits, l)
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
			if l.n != 0 {
				ops = append(ops, clientv3.OpDelete(mark+strconv.Itoa(l.n)))
			}
		}
		for _, k := range l.stray {
			if k != mark+strconv.Itoa(n) {
				ops = append(ops, clientv3.OpDelete(k))
			}
		}
		tresp, err := retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Then(ops...).Commit()
		})
		switch {
		case err != nil && claim.Use != 0 && l.n == 0 && errors.Is(err, rpctypes.ErrPermissionDenied):
			claim = Claim{} // a user granted the kind's sub-ranges alone: write without the guard
			continue
		case err != nil:
			return fmt.Errorf("write %s: %w", record, err)
		case tresp.Succeeded && l.n != 0 && !l.marked:
			continue // marked: now the change
		case tresp.Succeeded:
			return nil
		}
		if l.n == 0 {
			if err := Check(ctx, cli, claim); err != nil {
				return err
			}
		}
		if err := b.wait(ctx); err != nil { // it changed between: read again
			return err
		}
	}
}

// markedIn is the capacity the markers under mark among kvs say (the least, should an
// operator have left more than one); false without a mark or a marker.
func markedIn(kvs []*mvccpb.KeyValue, mark string) (int, bool) {
	least := 0
	for _, kv := range kvs {
		rest, ok := strings.CutPrefix(string(kv.Key), mark)
		if n, marked := markedLimit(rest); mark != "" && ok && marked && (least == 0 || n < least) {
			least = n
		}
	}
	return least, least > 0
}

// Watermark is the create revision through which a semaphore's permits hold whatever its
// limit (see above), from kvs, the keys of its name under prefix read with their values;
// 0 if none.
func Watermark(prefix string, kvs []*mvccpb.KeyValue) int64 {
	var record, markers []*mvccpb.KeyValue
	for _, kv := range kvs {
		switch rest := strings.TrimPrefix(string(kv.Key), prefix); {
		case rest == RecordLimit:
			record = append(record, kv)
		case strings.HasPrefix(rest, LimitMark):
			markers = append(markers, kv)
		}
	}
	l, err := limitOf(prefix, record, markers)
	if err != nil {
		return 0
	}
	return l.held
}
