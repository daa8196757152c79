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

// A semaphore's limit lives in etcd beside its permits, in two keys without a lease: the
// record (RecordLimit), whose value is the limit and which every write of a permit compares
// (Spec.Guard), and its marker, "<LimitMark><n>", whose name says the same limit. A change
// (package semaphore's SetLimit) writes the record and replaces the marker in one Txn,
// having read them (LimitReads, LimitOf) and the permits (HeldPermits). Waiters hear
// deletes only, so the marker's delete is what tells them, in order with the releases,
// that the limit changed; its successor's name, which a keys-only read of the name
// returns, says to what (Spec.CapacityMark, queueWaiter.recount). A waiter that approaches
// watches the marker too. A record written by a version without markers gets its marker
// before its first change, by a put no waiter needs to hear.
//
// Who holds is then no longer a matter of the present keys alone: after a lowering, the
// permits that held keep holding, beyond what the new limit would serve. The marker's value
// says through which create revision the permits held when it was written (its watermark):
// a permit holds if it was created at or before it, or if its units fit beside those ahead
// of it under the limit (heldPermits). The change reads the permits and compares, in its
// Txn, that those that held and the first that waited are still there, so that nobody was
// served under the old limit between its read and its write.

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

// LimitState is what etcd records of a semaphore's limit.
type LimitState struct {
	N      int      // the limit; 0 without a record
	Rev    int64    // the record's mod revision; 0 without a record
	Marked bool     // its marker is there
	Held   int64    // the marker's watermark (see above)
	Stray  []string // other markers (an operator's: ours are replaced in one Txn)
}

// LimitOf is the LimitState that record (zero or one key) and markers, read together with
// their values, say.
func LimitOf(prefix string, record, markers []*mvccpb.KeyValue) (LimitState, error) {
	var l LimitState
	if len(record) > 0 {
		n, ok := markedLimit(string(record[0].Value))
		if !ok {
			return LimitState{}, fmt.Errorf("%w: %s records %q, not a limit", ErrLimitMismatch, prefix+RecordLimit, record[0].Value)
		}
		l.N, l.Rev = n, record[0].ModRevision
	}
	for _, kv := range markers {
		if n, ok := markedLimit(strings.TrimPrefix(string(kv.Key), prefix+LimitMark)); ok && n == l.N {
			l.Marked = true
			l.Held, _ = strconv.ParseInt(string(kv.Value), 10, 64)
		} else {
			l.Stray = append(l.Stray, string(kv.Key))
		}
	}
	return l, nil
}

// LimitReads are the ops that read a semaphore's limit: its record and its markers.
func LimitReads(prefix string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(prefix + RecordLimit), clientv3.OpGet(prefix+LimitMark, clientv3.WithPrefix())}
}

// ReadLimit is the limit etcd records for the semaphore at prefix; 0 for none. One
// linearizable Txn, retried through leader changes.
func ReadLimit(ctx context.Context, cli *clientv3.Client, prefix string) (int, error) {
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(LimitReads(prefix)...).Commit()
	})
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", prefix+RecordLimit, err)
	}
	l, err := LimitOf(prefix, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs)
	return l.N, err
}

// HeldPermits reports which of kvs, the permit keys of a semaphore under prefix+kind in
// create-revision order, hold under l (see above).
func HeldPermits(prefix, kind string, kvs []*mvccpb.KeyValue, l LimitState) []bool {
	w := weigher{units: prefix + kind + unitsMark}
	held := make([]bool, len(kvs))
	ahead := 0
	for i, kv := range kvs {
		units := w.of(string(kv.Key))
		if held[i] = kv.CreateRevision <= l.Held || ahead+units <= l.N; !held[i] {
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
	l, err := LimitOf(prefix, record, markers)
	if err != nil {
		return 0
	}
	return l.Held
}

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
	if l == nil {
		return errUnmade
	}
	return clientUnusable(l.cli)
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

// ParseLatch is the count and Set ID a record's value says.
func ParseLatch(kv *mvccpb.KeyValue) (count int, id string, err error) {
	c, id, _ := strings.Cut(string(kv.Value), " ")
	count, err = strconv.Atoi(c)
	if err != nil || count < 0 {
		return 0, "", fmt.Errorf("latch record %s holds %q, not a count", kv.Key, kv.Value)
	}
	return count, id, nil
}

// Client is the latch's client.
func (l *Latch) Client() *clientv3.Client { return l.cli }

// Claim is the latch's claim on its name, for Record.
func (l *Latch) Claim() Claim { return Claim{strings.TrimSuffix(l.record, latchKey), UseLatch} }

// LatchCount is what a latch's record and the number of its markers say: the count it was
// set to and the count now (at least 0).
func LatchCount(record *mvccpb.KeyValue, markers int) (set, now int, err error) {
	set, _, err = ParseLatch(record)
	return set, max(set-markers, 0), err
}

// OnceRecordKey is the key of a once job's record (package once) beside the name's keys:
// the name itself and a NUL byte, outside the prefix its holders and waiters range over, as
// a handover's and an operator's release records are.
func OnceRecordKey(namePrefix string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00once"
}
