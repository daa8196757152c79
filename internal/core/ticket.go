package core

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hold that outlives its process: Detach moves a hold's key onto a lease of its own
// (a Put keeps the key's create revision, so its place and token stay), which nobody
// renews, and ends the hold here without releasing it; the Ticket names the key and the
// write. Resume, anywhere, checks in one Txn that the key is still the one the ticket names
// and writes it again on the same lease, which changes its mod revision: the ticket then
// names a write that is no longer the last, so it resumes once. The resumed hold renews
// that lease with a keep-alive of its own and revokes it when it ends.
//
// The ticket's nonce is the mod revision of the detaching write: etcd assigns it, no two
// writes share it, and any later write of the key (a Resume, an operator's) changes it. A
// random nonce in the value would protect nothing more: whoever can read the key can read
// its value, and so can build a ticket for any key. What makes a ticket safe is what it is
// checked against: a ticket is honoured only for a key that the detaching write marked so
// (its value starts with detachedMark), that is alone on its lease (the lease Detach
// granted for it), and, for a kind that holds alone, that has no key of its kind ahead. A
// live hold, a waiter, a key on a client's shared lease or a resumed hold fails one of
// these, and the ticket is stale: nothing is written and no lease revoked.

// ErrStaleTicket: a ticket that does not name a detached hold: its key is gone (released,
// or its lease ran out), was resumed with that ticket already, was taken again, or was
// never detached. Nothing was written.
var ErrStaleTicket = errors.New("etcdsync: stale ticket")

// Ticket names a detached hold: its key, the lease it was moved to, its create revision
// (the token) and the mod revision of the write that moved it (the nonce).
type Ticket struct {
	Key   string
	Lease clientv3.LeaseID
	Token int64
	Nonce int64
}

const ticketVersion = "t1"

// detachedMark starts the value of a detached hold's key: "detached " and the owner value
// of the process that detached it. Only Detach writes it, in the put that moves the key
// onto its own lease, and Resume writes it away.
const detachedMark = "detached "

// markedDetached is a compare that holds while key's value starts with detachedMark (etcd
// compares values byte-wise: '!' follows ' ').
func markedDetached(key string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(key), ">", detachedMark),
		clientv3.Compare(clientv3.Value(key), "<", strings.TrimSuffix(detachedMark, " ")+"!"),
	}
}

// IsDetached reports whether value is a detached hold's.
func IsDetached(value string) bool { return strings.HasPrefix(value, detachedMark) }

// names reports whether kv is the key t names, as the detaching write left it.
func (t Ticket) names(kv *mvccpb.KeyValue) bool {
	return kv != nil && string(kv.Key) == t.Key && kv.CreateRevision == t.Token && kv.ModRevision == t.Nonce &&
		clientv3.LeaseID(kv.Lease) == t.Lease && IsDetached(string(kv.Value))
}

// checkTicket reports, wrapped around ErrStaleTicket, why t does not name a detached hold
// as far as one Txn cannot compare: its lease must live and carry its key alone. It returns
// the lease's remaining TTL. One LeaseTimeToLive.
func checkTicket(ctx context.Context, cli *clientv3.Client, t Ticket) (time.Duration, error) {
	ttl, err := Retry(ctx, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return cli.TimeToLive(clientv3.WithRequireLeader(ctx), t.Lease, clientv3.WithAttachedKeys())
	})
	switch {
	case err != nil:
		return 0, err
	case ttl.TTL <= 0:
		return 0, fmt.Errorf("%w: %s: its lease %x has ended", ErrStaleTicket, t.Key, int64(t.Lease))
	case len(ttl.Keys) != 1 || string(ttl.Keys[0]) != t.Key:
		return 0, fmt.Errorf("%w: %s: its lease %x carries %d keys: not a detached hold's", ErrStaleTicket,
			t.Key, int64(t.Lease), len(ttl.Keys))
	}
	return time.Duration(ttl.TTL) * time.Second, nil
}

// ticketCompares are the compares of a Txn that acts on the hold t names: its key as the
// detaching write left it.
func ticketCompares(t Ticket) []clientv3.Cmp {
	return append([]clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Token),
		clientv3.Compare(clientv3.ModRevision(t.Key), "=", t.Nonce),
		clientv3.Compare(clientv3.LeaseValue(t.Key), "=", t.Lease),
	}, markedDetached(t.Key)...)
}

// staleWhy says why the key as read (kvs, of a keys-and-values Get) is not the one t names.
func staleWhy(t Ticket, kvs []*mvccpb.KeyValue) error {
	why := "its key is gone"
	switch {
	case len(kvs) == 1 && kvs[0].CreateRevision == t.Token && kvs[0].ModRevision == t.Nonce && !IsDetached(string(kvs[0].Value)):
		why = "its key was never detached"
	case len(kvs) == 1 && kvs[0].CreateRevision == t.Token && kvs[0].ModRevision == t.Nonce:
		why = "its key is not on the ticket's lease"
	case len(kvs) == 1 && kvs[0].CreateRevision == t.Token:
		why = "the ticket was used: the hold was resumed, or its key written, since"
	case len(kvs) == 1:
		why = "the name was taken again"
	}
	return fmt.Errorf("%w: %s: %s", ErrStaleTicket, t.Key, why)
}

// String is the ticket as one shell-safe word: t1.LEASE.TOKEN.NONCE.KEY, the lease in hex
// and the key in unpadded base64url.
func (t Ticket) String() string {
	return fmt.Sprintf("%s.%x.%d.%d.%s", ticketVersion, int64(t.Lease), t.Token, t.Nonce,
		base64.RawURLEncoding.EncodeToString([]byte(t.Key)))
}

// ParseTicket reads what Ticket.String wrote; ErrInvalidOption for anything else.
func ParseTicket(s string) (Ticket, error) {
	bad := func(why string) (Ticket, error) {
		return Ticket{}, fmt.Errorf("%w: ticket %q: %s", ErrInvalidOption, s, why)
	}
	f := strings.Split(s, ".")
	if len(f) != 5 || f[0] != ticketVersion {
		return bad("not a ticket of etcdsync (t1.LEASE.TOKEN.NONCE.KEY)")
	}
	lease, err1 := strconv.ParseInt(f[1], 16, 64)
	token, err2 := strconv.ParseInt(f[2], 10, 64)
	nonce, err3 := strconv.ParseInt(f[3], 10, 64)
	key, err4 := base64.RawURLEncoding.DecodeString(f[4])
	switch {
	case errors.Join(err1, err2, err3, err4) != nil:
		return bad("a field does not parse")
	case lease <= 0 || token <= 0 || nonce < token || len(key) == 0:
		return bad("a field is out of range")
	}
	return Ticket{Key: string(key), Lease: clientv3.LeaseID(lease), Token: token, Nonce: nonce}, nil
}

// Detach moves the hold's key onto a new lease of the same TTL as its own, which nobody
// renews, and ends the hold here without releasing it: Done closes, Err is nil, the key and
// the new lease stay until the lease's TTL runs out, unless renewed (RenewTicket) or
// resumed (Resume). The key's slot stays claimed in this process, so that no later
// acquisition here names a key that may still be there.
//
// Errors: ErrNotLocked if the hold has ended or is being released; ErrLost if its key is
// gone (the hold is then lost); etcd's error otherwise, the hold unchanged. Cost: a
// LeaseTimeToLive, a LeaseGrant and one Txn.
func (h *Hold) Detach(ctx context.Context) (Ticket, error) {
	h.mu.Lock()
	if h.state != held {
		h.mu.Unlock()
		return Ticket{}, ErrNotLocked
	}
	h.state = releasing
	h.mu.Unlock()
	t, err := h.detach(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.slot.detach()
		h.endWith(over, nil, false)
	case errors.Is(err, ErrLost):
		h.state = held
		h.end(lost, err)
	default:
		h.state = held
		if h.seen != nil {
			h.end(lost, h.seen)
		}
	}
	return t, err
}

func (h *Hold) detach(ctx context.Context) (Ticket, error) {
	ttl, err := Retry(ctx, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return h.cli.TimeToLive(clientv3.WithRequireLeader(ctx), h.sess.id)
	})
	if err != nil {
		return Ticket{}, fmt.Errorf("detach %s: %w", h.key, err)
	}
	if ttl.TTL < 0 {
		return Ticket{}, fmt.Errorf("%w: detach %s: its lease is gone", ErrLost, h.key)
	}
	lease, err := Retry(ctx, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return h.cli.Grant(clientv3.WithRequireLeader(ctx), ttl.GrantedTTL)
	})
	if err != nil {
		return Ticket{}, fmt.Errorf("detach %s: %w", h.key, err)
	}
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return h.cli.Txn(clientv3.WithRequireLeader(ctx)).If(h.IsOwner()).
			Then(clientv3.OpPut(h.key, detachedMark+OwnerValue(""), clientv3.WithLease(lease.ID))).Commit()
	})
	if err != nil || !resp.Succeeded {
		// Revoking the new lease removes the key too if a lost answer hid its move.
		revokeLease(h.cli, lease.ID)
	}
	switch {
	case err != nil:
		return Ticket{}, fmt.Errorf("detach %s: %w", h.key, err)
	case !resp.Succeeded:
		return Ticket{}, fmt.Errorf("detach %s: %w", h.key, h.goneErr(ctx))
	}
	return Ticket{Key: h.key, Lease: lease.ID, Token: h.rev, Nonce: resp.Header.Revision}, nil
}

// revokeLease revokes id, bounded by cleanupWait; what fails is left to the lease's TTL.
func revokeLease(cli *clientv3.Client, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(cli.Ctx(), cleanupWait)
	defer cancel()
	_, _ = cli.Revoke(clientv3.WithRequireLeader(ctx), id)
}

// Resume takes over the detached hold t names, as a hold of q of the kind spec describes:
// the ticket's lease must carry its key alone (checkTicket), and one Txn checks that its
// key is there as the detaching write left it (token, nonce, lease, the mark) and, for a
// kind that holds alone, that no key of the kind is ahead of it, and writes it again on
// that lease without the mark (so the ticket resumes once, and no ticket built from the
// resumed key does); a keep-alive of its own then renews the lease, with a local deadline
// as the shared ones', and the key is watched. The lease is revoked once the hold has ended
// and its key is gone.
//
// The caller checks that t's key is one of its kind under q's name.
//
// Errors: ErrStaleTicket, saying why, when t does not name a detached hold, having written
// nothing; etcd's error otherwise. Cost: a LeaseTimeToLive, one Txn and a
// LeaseKeepAliveOnce, then a watch of the key.
func (q *Queue) Resume(ctx context.Context, t Ticket, spec Spec) (*Hold, error) {
	cli := q.cli
	if _, err := checkTicket(ctx, cli, t); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	cmps := ticketCompares(t)
	if !spec.weighted() {
		// Nothing of its kind ahead: every key the kind waits behind came after it.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q.prefix+spec.Ahead), ">", t.Token-1).
			WithPrefix())
	}
	// The value names this Resume, so that a try sent again after one that was applied
	// without an answer knows its own write from another Resume's of the same ticket.
	value := OwnerValue("resume=" + uuid.NewString())
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).
			Then(clientv3.OpPut(t.Key, value, clientv3.WithLease(t.Lease))).
			Else(clientv3.OpGet(t.Key)).Commit()
	})
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", t.Key, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		ours := len(kvs) == 1 && kvs[0].CreateRevision == t.Token && clientv3.LeaseID(kvs[0].Lease) == t.Lease &&
			string(kvs[0].Value) == value
		switch {
		case ours: // an earlier try of this Resume was applied
		case len(kvs) == 1 && t.names(kvs[0]):
			return nil, fmt.Errorf("%w: %s: a key of its kind is ahead of it: it does not hold", ErrStaleTicket, t.Key)
		default:
			return nil, staleWhy(t, kvs)
		}
	}
	sent := time.Now()
	ka, err := Retry(ctx, func(ctx context.Context) (*clientv3.LeaseKeepAliveResponse, error) {
		return cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), t.Lease)
	})
	if err != nil {
		// The key is resumed and the lease renewed by nobody: it goes with its TTL, or now.
		revokeLease(cli, t.Lease)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, fmt.Errorf("%w: %s: its lease %x has ended", ErrStaleTicket, t.Key, int64(t.Lease))
		}
		return nil, fmt.Errorf("resume %s: %w", t.Key, err)
	}
	sess := startKeepAlive(cli, t.Lease, sent, time.Duration(ka.TTL)*time.Second, nil)
	sess.cluster = resp.Header.ClusterId
	sess.claim()
	sess.retire() // revoked once the key's slot is freed: the lease carries this key alone
	sl := &slot{k: t.Key, name: len(q.prefix), stem: -1, sess: sess}
	h := newHold(cli, sess, sl, t.Token)
	bound([]*Queue{q}, h)
	h.watch()
	return h, nil
}

// RenewTicket renews the lease of the detached hold t names once, for its TTL, and reports
// the TTL granted. Errors: ErrStaleTicket, having renewed nothing, when t does not name a
// detached hold (its lease has ended or carries other keys, its key is gone, taken again,
// resumed, or was never detached). Cost: a LeaseTimeToLive, a Range and a
// LeaseKeepAliveOnce.
func RenewTicket(ctx context.Context, cli *clientv3.Client, t Ticket) (time.Duration, error) {
	if _, err := checkTicket(ctx, cli, t); err != nil {
		return 0, err
	}
	resp, err := cli.Get(clientv3.WithRequireLeader(ctx), t.Key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) != 1 || !t.names(resp.Kvs[0]) {
		return 0, staleWhy(t, resp.Kvs)
	}
	ka, err := cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), t.Lease)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return 0, fmt.Errorf("%w: %s: its lease %x has ended", ErrStaleTicket, t.Key, int64(t.Lease))
	case err != nil:
		return 0, err
	}
	return time.Duration(ka.TTL) * time.Second, nil
}

// ReleaseTicket releases the detached hold t names: one Txn deletes its key if it is still
// as the detaching write left it, and its lease, which carried it alone, is revoked once
// a read finds it carries nothing. Errors: ErrStaleTicket when t does not name a detached
// hold (nothing written, nothing revoked). Cost: a LeaseTimeToLive, one Txn, a second
// LeaseTimeToLive and a LeaseRevoke.
func ReleaseTicket(ctx context.Context, cli *clientv3.Client, t Ticket) error {
	if _, err := checkTicket(ctx, cli, t); err != nil {
		return err
	}
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).If(ticketCompares(t)...).
		Then(clientv3.OpDelete(t.Key)).Else(clientv3.OpGet(t.Key)).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return staleWhy(t, resp.Responses[0].GetResponseRange().Kvs)
	}
	// A lease that carries a key is never revoked here, whatever the ticket said.
	ttl, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), t.Lease, clientv3.WithAttachedKeys())
	switch {
	case err != nil:
		return fmt.Errorf("released %s; read its lease: %w", t.Key, err)
	case ttl.TTL <= 0 || len(ttl.Keys) > 0:
		return nil // gone already; or it carries another's key, which its TTL or owner ends
	}
	if _, err := cli.Revoke(clientv3.WithRequireLeader(ctx), t.Lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("released %s; revoke its lease: %w", t.Key, err)
	}
	return nil
}
