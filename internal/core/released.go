package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrReleasedByOperator: an operator released the hold (admin.Release, etcdsync release):
// its key was deleted by its token, with a record of why. A loss: errors.Is(err, ErrLost)
// holds too.
var ErrReleasedByOperator = errors.New("etcdsync: released by an operator")

// ReleaseRecord is what an operator's release leaves beside the key it deleted, for the
// holder to read: why, who, when.
type ReleaseRecord struct {
	Reason string    `json:"reason"`
	By     string    `json:"by"` // user@host of the operator
	At     time.Time `json:"at"`
	Token  int64     `json:"token"`
}

// ReleaseRecordKey is where the record of the release of key lies, key being under
// namePrefix (a name's key prefix, NamePrefix after any WithPrefix): namePrefix without its
// '/', "\x00released/", and the rest of key. No name holds a NUL byte, so it is never a
// name's key, and it sorts before namePrefix ('\x00' < '/'), outside the name's range; it
// is under the same WithPrefix, so a prefix grant covers it.
func ReleaseRecordKey(namePrefix, key string) string {
	return strings.TrimSuffix(namePrefix, "/") + "\x00released/" + strings.TrimPrefix(key, namePrefix)
}

// recordWait bounds the read of a release record: a holder whose key went is told within
// it, with the record's reason or without.
const recordWait = time.Second

// errDeletedWhileWaiting is why a wait whose own key was deleted failed.
var errDeletedWhileWaiting = errors.New("deleted while waiting")

// goneErr is the loss of a hold whose key is no longer the one it created: released by an
// operator, with the record's reason, if a record of that release is there; else deleted
// (or gone with its lease). The record is read only while the hold is held: a hold being
// released sees its own delete go, which needs no reason and must cost no read.
func (h *Hold) goneErr(ctx context.Context) error {
	h.mu.Lock()
	live := h.state == held
	h.mu.Unlock()
	// A key that went with its lease needs no record read: the holds of a lease that ends
	// ask once together (leaseGone), not a read each.
	if live && h.sess.lostErr() == nil && !leaseGone(h.cli, h.sess) {
		if err := releasedErr(ctx, h.cli, h.slot, h.rev); err != nil {
			return err
		}
	}
	return errKeyGone(h.key)
}

// releasedErr is the loss of the key of slot s created at rev if an operator released it (a
// record of that release is there), else nil. One Range, bounded by recordWait.
func releasedErr(ctx context.Context, cli *clientv3.Client, s *slot, rev int64) error {
	if s == nil || s.name == 0 {
		return nil
	}
	key := s.key()
	ctx, cancel := context.WithTimeout(ctx, recordWait)
	defer cancel()
	resp, err := cli.Get(clientv3.WithRequireLeader(ctx), ReleaseRecordKey(key[:s.name], key))
	if err != nil || len(resp.Kvs) == 0 {
		return nil
	}
	var rec ReleaseRecord
	if json.Unmarshal(resp.Kvs[0].Value, &rec) != nil || rec.Token != rev {
		return nil
	}
	return operatorLoss(key, rec)
}

// recordBatch is how many release records one Txn reads (etcd takes 128 ops by default),
// and recordReaders how many such Txns are in flight at once.
const (
	recordBatch   = 64
	recordReaders = 4
)

// releasedErrs is releasedErr for each of holds, whose keys were all seen gone while their
// leases lived: the records are read in Txns of recordBatch Gets, recordReaders at a time,
// all bounded by recordWait, so that thousands of keys deleted at once (an operator's del
// --prefix) are told within it. A nil entry: no record, or none could be read.
func releasedErrs(ctx context.Context, cli *clientv3.Client, holds []*Hold) []error {
	errs := make([]error, len(holds))
	ctx, cancel := context.WithTimeout(ctx, recordWait)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, recordReaders)
	for start := 0; start < len(holds); start += recordBatch {
		batch := holds[start:min(start+recordBatch, len(holds))]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ops := make([]clientv3.Op, 0, len(batch))
			for _, h := range batch {
				ops = append(ops, clientv3.OpGet(h.recordKey()))
			}
			resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
			if err != nil {
				return
			}
			for i, h := range batch {
				errs[start+i] = h.releasedBy(resp.Responses[i].GetResponseRange().GetKvs())
			}
		}()
	}
	wg.Wait()
	return errs
}

// recordKey is where the record of an operator's release of h's key would lie; "" for a
// hold with no name (see releasedErr).
func (h *Hold) recordKey() string {
	if h.slot == nil || h.slot.name == 0 {
		return ""
	}
	return ReleaseRecordKey(h.key[:h.slot.name], h.key)
}

// releasedBy is the loss of h if kvs, a read of its recordKey, holds the record of an
// operator's release of it; else nil.
func (h *Hold) releasedBy(kvs []*mvccpb.KeyValue) error {
	if len(kvs) == 0 {
		return nil
	}
	var rec ReleaseRecord
	if json.Unmarshal(kvs[0].Value, &rec) != nil || rec.Token != h.rev {
		return nil
	}
	return operatorLoss(h.key, rec)
}

// operatorLoss is the loss of the key an operator released, as rec says.
func operatorLoss(key string, rec ReleaseRecord) error {
	return &ReleasedError{Key: key, Record: rec}
}

// ReleasedError is the loss of a hold that an operator released: the key, and the record
// the release left (why, who, when). It matches ErrLost and ErrReleasedByOperator.
type ReleasedError struct {
	Key    string
	Record ReleaseRecord
}

func (e *ReleasedError) Error() string {
	return fmt.Sprintf("%v: %v: key %s: %s (by %s at %s)", ErrLost, ErrReleasedByOperator, e.Key,
		quoteReason(e.Record.Reason), e.Record.By, e.Record.At.Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrLost) and errors.Is(err, ErrReleasedByOperator) hold.
func (e *ReleasedError) Unwrap() []error { return []error{ErrLost, ErrReleasedByOperator} }

// quoteReason is an operator's reason as a loss quotes it: "no reason given" for none.
func quoteReason(reason string) string {
	if reason == "" {
		return "no reason given"
	}
	return strconv.Quote(reason)
}

// whyGone is err, the failure of a wait, or the operator's release of the key of slot s
// created at rev when that is why its key went.
func whyGone(ctx context.Context, cli *clientv3.Client, s *slot, rev int64, err error) error {
	if !errors.Is(err, errDeletedWhileWaiting) {
		return err
	}
	if rel := releasedErr(context.WithoutCancel(ctx), cli, s, rev); rel != nil {
		return rel
	}
	return err
}
