package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

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
	if live {
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
	return fmt.Errorf("%w: %w: key %s: %q (by %s at %s)", ErrLost, ErrReleasedByOperator, key,
		rec.Reason, rec.By, rec.At.Format(time.RFC3339))
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
