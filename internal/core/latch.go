package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A countdown latch is data, not a hold: a record "<name>/latch" whose value is the count
// it was set to and the ID of the Set that wrote it ("<count> <id>"), and one marker
// "<name>/latch/<participant>" per count down, written once (created if absent): the count
// is the record's less the markers, never below 0. No key has a lease; all stay until
// DeleteLatch. So a count down is one Txn that contends with no other (each writes a key
// of its own), a participant that names itself counts once however often it tries, and a
// retry after an unknown answer finds its marker. A waiter reads the record and counts
// the markers, then counts the markers' creates from the watch of the latch's keys.

// ErrAlreadySet: a latch's count was set already, by another Set; it wrote nothing.
var ErrAlreadySet = errors.New("etcdsync: latch already set")

// ErrNotSet: a latch that has no count (never set, or deleted) was counted down, or
// read; or it was deleted while awaited.
var ErrNotSet = errors.New("etcdsync: latch not set")

// latchKey is a latch's record under its name's prefix; its markers are under latchKey/.
const latchKey = "latch"

// anonymous starts the marker of a count down by no named participant: a name's escape
// (NamePrefix) writes '%' only as "%25" or "%2F", so no participant's marker starts so.
const anonymous = "%u"

// MaxLatchCount is the highest count a latch takes.
const MaxLatchCount = 1_000_000

// Latch is a countdown latch under a name's prefix.
type Latch struct {
	cli    *clientv3.Client
	record string // the record's key
}

// NewLatch returns the latch of name under c's prefix. It does no I/O.
func NewLatch(cli *clientv3.Client, c Config, name string) *Latch {
	return &Latch{cli: cli, record: c.KeyPrefix(name) + latchKey}
}

// Unusable says why l cannot serve a call (see Queue.Unusable); nil when it can.
func (l *Latch) Unusable() error {
	switch {
	case l == nil:
		return errUnmade
	case l.cli.Ctx().Err() != nil:
		return errClientClosedOption
	}
	return nil
}

// Prefix is the prefix of the latch's keys, its record's key included.
func (l *Latch) Prefix() string { return l.record }

// MarkerOf is the key of participant's marker; an empty participant gets one of its own.
func (l *Latch) MarkerOf(participant string) string {
	if participant == "" {
		return l.record + "/" + anonymous + uuid.NewString()
	}
	return l.record + "/" + strings.TrimSuffix(NamePrefix(participant), "/")
}

// parseLatch is the count and Set ID a record's value says.
func parseLatch(kv *mvccpb.KeyValue) (count int, id string, err error) {
	c, id, _ := strings.Cut(string(kv.Value), " ")
	count, err = strconv.Atoi(c)
	if err != nil || count < 0 {
		return 0, "", fmt.Errorf("latch record %s holds %q, not a count", kv.Key, kv.Value)
	}
	return count, id, nil
}

// Set writes the record with count, if there is none: one Txn, retried through leader
// changes; a retry of one that was applied finds its own ID. ErrAlreadySet if another
// Set wrote it.
func (l *Latch) Set(ctx context.Context, count int) error {
	id := uuid.NewString()
	value := strconv.Itoa(count) + " " + id
	claim := Claim{strings.TrimSuffix(l.record, latchKey), UseLatch}
	stored, err := Record(ctx, l.cli, claim, l.record, value)
	switch {
	case err != nil:
		return waitErr(ctx, l.cli, err)
	case stored != value:
		return fmt.Errorf("%w: it holds %q", ErrAlreadySet, stored)
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
func (l *Latch) read(ctx context.Context) (latchState, error) {
	resp, err := readState(ctx, l.cli,
		clientv3.OpGet(l.record),
		clientv3.OpGet(l.record+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()))
	if err != nil {
		return latchState{}, err
	}
	s := latchState{rev: resp.Header.Revision}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if s.initial, _, err = parseLatch(kvs[0]); err != nil {
			return s, err
		}
		s.set = true
		s.markers = int(resp.Responses[1].GetResponseRange().Count)
		s.count = max(s.initial-s.markers, 0)
	}
	return s, nil
}

// Count is the latch's count now: one read. ErrNotSet without a record.
func (l *Latch) Count(ctx context.Context) (int, error) {
	s, err := l.read(ctx)
	switch {
	case err != nil:
		return 0, err
	case !s.set:
		return 0, ErrNotSet
	}
	return s.count, nil
}

// CountDown writes marker (MarkerOf) if the record is there and the marker is not: one
// Txn, tried again through leader changes and answers that did not come while ctx has time
// (a try applied finds its marker, and counts once). A marker there already is a count
// down done: nil. ErrNotSet without a record.
func (l *Latch) CountDown(ctx context.Context, marker string) error {
	if err := ctx.Err(); err != nil {
		return err // before any I/O: a try outlives ctx (see commitWrite), and would write
	}
	res, err := commitWrite(ctx, l.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.If(
			clientv3.Compare(clientv3.CreateRevision(l.record), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(marker), "=", 0),
		).Then(clientv3.OpPut(marker, OwnerValue(""))).
			Else(clientv3.OpGet(l.record, clientv3.WithCountOnly()))
	})
	switch {
	case res.resp == nil:
		return waitErr(ctx, l.cli, err)
	case res.resp.Succeeded:
		return nil
	case res.resp.Responses[0].GetResponseRange().Count == 0:
		return ErrNotSet
	}
	return nil // counted down already, by this call's earlier try or another
}

// Await returns once the count is zero: the watch of the latch's keys, one read, then the
// markers the watch sees created, counted; a read again after a gap (see follow.go).
// Without a record it waits for a Set. ErrNotSet, wrapped, when the record is deleted while
// the count is above zero.
func (l *Latch) Await(ctx context.Context) error {
	var s latchState
	check := func() (int64, verdict, error) {
		var err error
		if s, err = l.read(ctx); err != nil {
			return 0, stillWaiting, err
		}
		if s.set && s.count == 0 {
			return s.rev, waitOver, nil
		}
		return s.rev, stillWaiting, nil
	}
	_, err := follow(ctx, l.cli, l.record, nil, check, func(ev *clientv3.Event) (verdict, error) {
		switch key := string(ev.Kv.Key); {
		case key == l.record && ev.Type == clientv3.EventTypeDelete && s.set:
			return stillWaiting, fmt.Errorf("%w: the latch was deleted with a count of %d", ErrNotSet, s.count)
		case key == l.record:
			return readAgain, nil // set, or set again: count from a read
		case ev.Type == clientv3.EventTypePut && ev.IsCreate() && s.set:
			if s.count--; s.count <= 0 {
				return waitOver, nil
			}
		}
		return stillWaiting, nil
	}, clientv3.WithPrefix())
	return err
}

// Delete deletes the latch's record and markers, in one Txn: a waiter then fails with
// ErrNotSet, and the name may be set again.
func (l *Latch) Delete(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err // before any I/O, as CountDown
	}
	_, err := commitWrite(ctx, l.cli, func(t clientv3.Txn) clientv3.Txn {
		return t.Then(
			clientv3.OpDelete(l.record),
			clientv3.OpDelete(l.record+"/", clientv3.WithPrefix()),
		)
	})
	if err != nil {
		return waitErr(ctx, l.cli, err)
	}
	return nil
}

// LatchCount is what a latch's record and the number of its markers say: the count it was
// set to and the count now (at least 0).
func LatchCount(record *mvccpb.KeyValue, markers int) (set, now int, err error) {
	set, _, err = parseLatch(record)
	return set, max(set-markers, 0), err
}
