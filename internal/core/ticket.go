package core

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

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
// its value.

// ErrStaleTicket: a ticket that no longer names a detached hold: its key is gone (released,
// or its lease ran out), was resumed with that ticket already, or was taken again. Nothing
// was written.
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
	ttl, err := retry(ctx, func() (*clientv3.LeaseTimeToLiveResponse, error) {
		return h.cli.TimeToLive(clientv3.WithRequireLeader(ctx), h.sess.id)
	})
	if err != nil {
		return Ticket{}, fmt.Errorf("detach %s: %w", h.key, err)
	}
	if ttl.TTL < 0 {
		return Ticket{}, fmt.Errorf("%w: detach %s: its lease is gone", ErrLost, h.key)
	}
	lease, err := retry(ctx, func() (*clientv3.LeaseGrantResponse, error) {
		return h.cli.Grant(clientv3.WithRequireLeader(ctx), ttl.GrantedTTL)
	})
	if err != nil {
		return Ticket{}, fmt.Errorf("detach %s: %w", h.key, err)
	}
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return h.cli.Txn(clientv3.WithRequireLeader(ctx)).If(h.IsOwner()).
			Then(clientv3.OpPut(h.key, "", clientv3.WithIgnoreValue(), clientv3.WithLease(lease.ID))).Commit()
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

// Resume takes over the detached hold t names, as a hold of q: one Txn checks that its key
// is there with the ticket's token, nonce and lease, and writes it again on that lease (so
// the ticket resumes once); a keep-alive of its own then renews the lease, with a local
// deadline as the shared ones', and the key is watched. The lease is revoked once the hold
// has ended and its key is gone.
//
// The caller checks that t's key is one of its kind under q's name.
//
// Errors: ErrStaleTicket, saying why, when t no longer names the hold, having written
// nothing; etcd's error otherwise. Cost: a LeaseKeepAliveOnce and one Txn, then a watch of
// the key.
func (q *Queue) Resume(ctx context.Context, t Ticket) (*Hold, error) {
	cli := q.cli
	sent := time.Now()
	ka, err := retry(ctx, func() (*clientv3.LeaseKeepAliveResponse, error) {
		return cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), t.Lease)
	})
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return nil, fmt.Errorf("%w: %s: its lease %x has ended", ErrStaleTicket, t.Key, int64(t.Lease))
	case err != nil:
		return nil, fmt.Errorf("resume %s: %w", t.Key, err)
	}
	resp, err := retry(ctx, func() (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).
			If(clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Token),
				clientv3.Compare(clientv3.ModRevision(t.Key), "=", t.Nonce),
				clientv3.Compare(clientv3.LeaseValue(t.Key), "=", t.Lease)).
			Then(clientv3.OpPut(t.Key, "", clientv3.WithIgnoreValue(), clientv3.WithLease(t.Lease))).
			Else(clientv3.OpGet(t.Key, clientv3.WithKeysOnly())).Commit()
	})
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", t.Key, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		why := "its key is gone"
		switch {
		case len(kvs) == 1 && kvs[0].CreateRevision == t.Token:
			why = "the ticket was used: the hold was resumed, or its key written, since"
		case len(kvs) == 1:
			why = "the name was taken again"
		}
		return nil, fmt.Errorf("%w: %s: %s", ErrStaleTicket, t.Key, why)
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
// the TTL granted. Errors: ErrStaleTicket when its lease has ended or its key is no longer
// the one t names. Cost: a LeaseKeepAliveOnce and a Range.
func RenewTicket(ctx context.Context, cli *clientv3.Client, t Ticket) (time.Duration, error) {
	ka, err := cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), t.Lease)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return 0, fmt.Errorf("%w: %s: its lease %x has ended", ErrStaleTicket, t.Key, int64(t.Lease))
	case err != nil:
		return 0, err
	}
	resp, err := cli.Get(clientv3.WithRequireLeader(ctx), t.Key, clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != t.Token || resp.Kvs[0].ModRevision != t.Nonce {
		return 0, fmt.Errorf("%w: %s: its key is gone, taken again or resumed", ErrStaleTicket, t.Key)
	}
	return time.Duration(ka.TTL) * time.Second, nil
}

// ReleaseTicket releases the detached hold t names: one Txn deletes its key if it is still
// the one t names, then its lease, which carried it alone, is revoked. Errors:
// ErrStaleTicket when the key is not the one t names (nothing written). Cost: one Txn and a
// LeaseRevoke.
func ReleaseTicket(ctx context.Context, cli *clientv3.Client, t Ticket) error {
	resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Token),
			clientv3.Compare(clientv3.ModRevision(t.Key), "=", t.Nonce)).
		Then(clientv3.OpDelete(t.Key)).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s: its key is gone, taken again or resumed", ErrStaleTicket, t.Key)
	}
	if _, err := cli.Revoke(clientv3.WithRequireLeader(ctx), t.Lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("released %s; revoke its lease: %w", t.Key, err)
	}
	return nil
}
