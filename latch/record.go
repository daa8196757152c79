package latch

import (
	"context"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// How a latch's record and markers (their layout: internal/core, records.go) are set,
// counted down and awaited. l.Prefix() is the record's key; the markers lie under it and
// "/".

// set writes the record with count, if there is none: one Txn, retried through leader
// changes; a retry of one that was applied finds its own ID. core.ErrAlreadySet if another
// Set wrote it.
func set(ctx context.Context, l *core.Latch, count int) error {
	id := uuid.NewString()
	value := strconv.Itoa(count) + " " + id
	stored, err := core.Record(ctx, l.Client(), l.Claim(), l.Prefix(), value)
	switch {
	case err != nil:
		return core.WaitErr(ctx, l.Client(), err)
	case stored != value:
		return fmt.Errorf("%w: it holds %q", core.ErrAlreadySet, stored)
	}
	return nil
}

// latchState is what one read says of a latch.
type latchState struct {
	set     bool
	count   int   // the record's less the markers, at least 0
	markers int   // the markers counted
	initial int   // the record's
	rev     int64 // the revision of the read
}

// read reads the record and counts the markers, at one revision.
func read(ctx context.Context, l *core.Latch) (latchState, error) {
	resp, err := core.ReadState(ctx, l.Client(),
		clientv3.OpGet(l.Prefix()),
		clientv3.OpGet(l.Prefix()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()))
	if err != nil {
		return latchState{}, err
	}
	s := latchState{rev: resp.Header.Revision}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if s.initial, _, err = core.ParseLatch(kvs[0]); err != nil {
			return s, err
		}
		s.set = true
		s.markers = int(resp.Responses[1].GetResponseRange().Count)
		s.count = max(s.initial-s.markers, 0)
	}
	return s, nil
}

// count is the latch's count now: one read. core.ErrNotSet without a record.
func count(ctx context.Context, l *core.Latch) (int, error) {
	s, err := read(ctx, l)
	switch {
	case err != nil:
		return 0, err
	case !s.set:
		return 0, core.ErrNotSet
	}
	return s.count, nil
}

// countDown writes marker (MarkerOf) if the record is there and the marker is not: one
// Txn, tried again through leader changes and answers that did not come while ctx has time
// (a try applied finds its marker, and counts once). A marker there already is a count
// down done: nil. core.ErrNotSet without a record.
func countDown(ctx context.Context, l *core.Latch, marker string) error {
	if err := ctx.Err(); err != nil {
		return err // before any I/O: a try outlives ctx (see core.CommitWrite), and would write
	}
	res, err := core.CommitWrite(ctx, l.Client(), func(t clientv3.Txn) clientv3.Txn {
		return t.If(
			clientv3.Compare(clientv3.CreateRevision(l.Prefix()), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(marker), "=", 0),
		).Then(clientv3.OpPut(marker, core.OwnerValue(""))).
			Else(clientv3.OpGet(l.Prefix(), clientv3.WithCountOnly()))
	})
	switch {
	case res.Resp == nil:
		return core.WaitErr(ctx, l.Client(), err)
	case res.Resp.Succeeded:
		return nil
	case res.Resp.Responses[0].GetResponseRange().Count == 0:
		return core.ErrNotSet
	}
	return nil // counted down already, by this call's earlier try or another
}

// await returns once the count is zero: the watch of the latch's keys, one read, then the
// markers the watch sees created, counted; a read again after a gap (see core.Follow).
// Without a record it waits for a Set. core.ErrNotSet, wrapped, when the record is deleted while
// the count is above zero.
func await(ctx context.Context, l *core.Latch) error {
	var s latchState
	check := func() (int64, core.Verdict, error) {
		var err error
		if s, err = read(ctx, l); err != nil {
			return 0, core.StillWaiting, err
		}
		if s.set && s.count == 0 {
			return s.rev, core.WaitOver, nil
		}
		return s.rev, core.StillWaiting, nil
	}
	_, err := core.Follow(ctx, l.Client(), l.Prefix(), nil, check, func(ev *clientv3.Event) (core.Verdict, error) {
		switch key := string(ev.Kv.Key); {
		case key == l.Prefix() && ev.Type == clientv3.EventTypeDelete && s.set:
			return core.StillWaiting, fmt.Errorf("%w: the latch was deleted with a count of %d", core.ErrNotSet, s.count)
		case key == l.Prefix():
			return core.ReadAgain, nil // set, or set again: count from a read
		case ev.Type == clientv3.EventTypePut && ev.IsCreate() && s.set:
			if s.count--; s.count <= 0 {
				return core.WaitOver, nil
			}
		}
		return core.StillWaiting, nil
	}, clientv3.WithPrefix())
	return err
}

// deleteAll deletes the latch's record and markers, in one Txn: a waiter then fails with
// core.ErrNotSet, and the name may be set again.
func deleteAll(ctx context.Context, l *core.Latch) error {
	if err := ctx.Err(); err != nil {
		return err // before any I/O, as CountDown
	}
	_, err := core.CommitWrite(ctx, l.Client(), func(t clientv3.Txn) clientv3.Txn {
		return t.Then(
			clientv3.OpDelete(l.Prefix()),
			clientv3.OpDelete(l.Prefix()+"/", clientv3.WithPrefix()),
		)
	})
	if err != nil {
		return core.WaitErr(ctx, l.Client(), err)
	}
	return nil
}
