package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A double barrier's participants are keys "<name>/in/<lease hex>_<slot>" on their
// sessions' leases, as a queue's; a crashed participant's key goes with its lease. The
// name's rounds are slices of their create revisions: a round is the first n participants
// created after the previous round's cutoff, and its cutoff is the create revision of its
// n-th. The record "<name>/round" (no lease) says the current round's number and the
// cutoffs of the rounds before, newest first ("<round> <cutoff> <cutoff> ..."; absent: round
// 1); "<name>/size" (no lease) says n, which every participant's put compares (Spec.Guard).
//
// Entering is one put of the participant's key, then a read of the round record and of the
// first n participants after the last cutoff. Whoever reads n or more there fills the round
// by a compare-and-swap of the record on the mod revision it read: the new cutoff is the
// n-th participant it read. Participants created later belong to the next round: an n+1th
// waits for that one, and so does every participant until the round before it fills. Every
// count of n or more is read by the participant whose put last raised it, so a round that
// has n participants is filled unless that one crashed before the swap (the round then
// fills at the next put, or never has n when that key goes with its lease). A participant
// that withdraws before its round filled (its Enter failed or was cancelled) deletes its key
// and writes the record back as it was, in one Txn fenced on the record's mod revision: a
// swap by one who read it before fails and reads again, so a withdrawn participant is never
// counted. One whose round filled before its withdrawal counts as one who entered and left.
// Waiters watch the record alone: a fill, or a withdrawal, is one event for each.
//
// Leaving (as in ZooKeeper's recipe): a participant deletes its key unless it is the first
// of its round with others still there; each then watches the first participant of its
// round left (the first, the last), and reads again when that one goes. So the first
// participant leaves last, and everyone returns once the round has no key.

// roundHistory is how many cutoffs the round record keeps: a participant that learns its
// round only after more rounds than that filled cannot tell where its round began.
const roundHistory = 64

// MaxParticipants is the largest n a double barrier takes.
const MaxParticipants = 100_000

// Barrier is a double barrier of n participants on a name.
type Barrier struct {
	q          *Queue
	n          int
	in         string // the prefix of the participants' keys
	round, sz  string // the records' keys
	lastCutoff int64  // a guess at the last cutoff, to start the first read with
}

// NewBarrier returns the double barrier of n participants on name, configured by c. It
// does no I/O.
func NewBarrier(cli *clientv3.Client, c Config, name string, n int) *Barrier {
	q := NewQueue(cli, c, name)
	return &Barrier{q: q, n: n, in: q.prefix + kindIn, round: q.prefix + roundRecord, sz: q.prefix + sizeRecord}
}

// Queue is the barrier's queue (its name, client and sessions).
func (b *Barrier) Queue() *Queue { return b.q }

// rounds is what the round record says.
type rounds struct {
	n    int64   // the current round's number, from 1
	cuts []int64 // the cutoffs of the rounds before it, newest first
}

func parseRounds(kvs []*mvccpb.KeyValue) (rounds, error) {
	if len(kvs) == 0 {
		return rounds{n: 1}, nil
	}
	fields := strings.Fields(string(kvs[0].Value))
	var r rounds
	for i, f := range fields {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v < 1 || (i > 1 && v >= r.cuts[i-2]) {
			return r, fmt.Errorf("round record %s holds %q, not a round and its cutoffs", kvs[0].Key, kvs[0].Value)
		}
		if i == 0 {
			r.n = v
		} else {
			r.cuts = append(r.cuts, v)
		}
	}
	if r.n == 0 || int64(len(r.cuts)) > r.n-1 {
		return r, fmt.Errorf("round record %s holds %q, not a round and its cutoffs", kvs[0].Key, kvs[0].Value)
	}
	return r, nil
}

func (r rounds) String() string {
	var s strings.Builder
	s.WriteString(strconv.FormatInt(r.n, 10))
	for _, c := range r.cuts {
		s.WriteString(" " + strconv.FormatInt(c, 10))
	}
	return s.String()
}

// filled is r after the current round filled at cutoff.
func (r rounds) filled(cutoff int64) rounds {
	cuts := append([]int64{cutoff}, r.cuts[:min(len(r.cuts), roundHistory-1)]...)
	return rounds{n: r.n + 1, cuts: cuts}
}

// last is the cutoff of the last round filled; 0 before the first.
func (r rounds) last() int64 {
	if len(r.cuts) == 0 {
		return 0
	}
	return r.cuts[0]
}

// place is where a participant created at revision x is: in a round filled (member), its
// number and the participants created after lo through hi; else in the current round,
// after lo.
func (r rounds) place(x int64) (lo, hi, round int64, member bool, err error) {
	if x > r.last() {
		return r.last(), 0, r.n, false, nil
	}
	for i, c := range r.cuts {
		round := r.n - 1 - int64(i)
		switch {
		case i+1 < len(r.cuts) && x <= r.cuts[i+1]:
			continue
		case i+1 < len(r.cuts):
			return r.cuts[i+1], c, round, true, nil
		case round == 1: // the first round of all
			return 0, c, round, true, nil
		}
	}
	return 0, 0, 0, false, fmt.Errorf("%w: the barrier filled more than %d rounds before this participant learned its own", ErrLost, roundHistory)
}

// Participant is one participant's key and, once it entered, its round.
type Participant struct {
	h      *Hold
	lo, hi int64 // its round: the participants created after lo through hi
	round  int64 // its round's number, from 1
}

// Hold is the participant's key.
func (p *Participant) Hold() *Hold { return p.h }

// Round is the number of the participant's round, from 1; 0 before it entered.
func (p *Participant) Round() int64 { return p.round }

// Enter writes a participant's key and returns once its round filled. On any failure,
// ctx's end included, it deletes the key (see withdraw) before returning.
func (b *Barrier) Enter(ctx context.Context) (*Participant, error) {
	size := strconv.Itoa(b.n)
	spec := Spec{Kind: kindIn, Ahead: kindIn, Value: OwnerValue(""), Use: UseBarrier,
		Guard: []clientv3.Cmp{clientv3.Compare(clientv3.Value(b.sz), "=", size)}}
	h, err := b.q.Join(ctx, spec)
	if errors.Is(err, ErrGuard) { // no size recorded yet, or another
		stored, rerr := Record(ctx, b.q.cli, Claim{b.q.prefix, UseBarrier}, b.sz, size)
		switch {
		case rerr != nil:
			return nil, waitErr(ctx, b.q.cli, rerr)
		case stored != size:
			return nil, fmt.Errorf("%w: the barrier on this name has %s participants, not %d", ErrInvalidOption, stored, b.n)
		}
		h, err = b.q.Join(ctx, spec)
	}
	if err != nil {
		if errors.Is(err, ErrGuard) {
			err = fmt.Errorf("%w: the barrier's size record changed under this Enter", ErrInvalidOption)
		}
		return nil, err
	}
	p := &Participant{h: h}
	if err := b.await(ctx, p); err != nil {
		b.withdraw(ctx, p)
		return nil, err
	}
	return p, nil
}

// snapshot is one read of the round record and of the first n participants after lo.
type snapshot struct {
	r     rounds
	mod   int64 // the record's mod revision; 0 without one
	after []*mvccpb.KeyValue
	rev   int64
}

func (b *Barrier) read(ctx context.Context, lo int64) (snapshot, error) {
	resp, err := readState(ctx, b.q.cli,
		clientv3.OpGet(b.round),
		clientv3.OpGet(b.in, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMinCreateRev(lo+1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(b.n))))
	if err != nil {
		return snapshot{}, err
	}
	rkvs := resp.Responses[0].GetResponseRange().Kvs
	s := snapshot{after: resp.Responses[1].GetResponseRange().Kvs, rev: resp.Header.Revision}
	if len(rkvs) == 1 {
		s.mod = rkvs[0].ModRevision
	}
	s.r, err = parseRounds(rkvs)
	return s, err
}

// await returns once p's round filled, filling it if p reads that it has n participants:
// it watches the round record, then reads (check), and takes each change of the record.
func (b *Barrier) await(ctx context.Context, p *Participant) error {
	x := p.h.Token()
	joined := func(l, hi, round int64) {
		p.lo, p.hi, p.round = l, hi, round
	}
	check := func() (int64, verdict, error) {
		lo := b.lastCutoff
		for {
			s, err := b.read(ctx, lo)
			if err != nil {
				return 0, stillWaiting, err
			}
			l, hi, round, member, err := s.r.place(x)
			switch {
			case err != nil:
				return 0, stillWaiting, err
			case member:
				joined(l, hi, round)
				return s.rev, waitOver, nil
			case l != lo: // the read began at the wrong cutoff: again from the right one
				lo, b.lastCutoff = l, l
				continue
			case len(s.after) >= b.n:
				// Fill it; the record's change, whoever made it, is the next event.
				next := s.r.filled(s.after[b.n-1].CreateRevision).String()
				if _, err := commitWrite(ctx, b.q.cli, func(t clientv3.Txn) clientv3.Txn {
					return t.If(clientv3.Compare(clientv3.ModRevision(b.round), "=", s.mod)).
						Then(clientv3.OpPut(b.round, next))
				}); err != nil {
					return 0, stillWaiting, waitErr(ctx, b.q.cli, err)
				}
			}
			return s.rev, stillWaiting, nil
		}
	}
	each := func(ev *clientv3.Event) (verdict, error) {
		if ev.Type == clientv3.EventTypePut {
			r, err := parseRounds([]*mvccpb.KeyValue{ev.Kv})
			if err != nil {
				return stillWaiting, err
			}
			if l, hi, round, member, err := r.place(x); err == nil && member {
				joined(l, hi, round)
				return waitOver, nil
			}
		}
		return readAgain, nil // a withdrawal, a round before p's filled, the record deleted
	}
	for {
		if err := p.h.Err(); err != nil {
			return err
		}
		ok, err := follow(ctx, b.q.cli, b.round, p.h.Done(), check, each)
		switch {
		case err != nil:
			return err
		case ok:
			return p.h.Err() // nil unless its key went meanwhile
		}
	}
}

// withdraw deletes the key of p, which failed to enter: if its round has not filled, in one
// Txn that writes the round record back as it was (see above), else as it leaves. Bounded
// by a few seconds after ctx; what is not done then is the janitor's.
func (b *Barrier) withdraw(ctx context.Context, p *Participant) {
	dctx, cancel := Detached(ctx)
	defer cancel()
	x := p.h.Token()
	for p.h.Live() && dctx.Err() == nil {
		resp, err := readState(dctx, b.q.cli, clientv3.OpGet(b.round))
		if err != nil {
			break
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		r, err := parseRounds(kvs)
		if err != nil {
			break
		}
		if _, _, _, member, _ := r.place(x); member {
			break // counted: it leaves
		}
		var mod int64
		if len(kvs) == 1 {
			mod = kvs[0].ModRevision
		}
		wr, err := commitWrite(dctx, b.q.cli, func(t clientv3.Txn) clientv3.Txn {
			return t.If(
				clientv3.Compare(clientv3.ModRevision(b.round), "=", mod),
				clientv3.Compare(clientv3.CreateRevision(p.h.key), "=", x),
			).Then(clientv3.OpDelete(p.h.key), clientv3.OpPut(b.round, r.String())).
				Else(clientv3.OpGet(p.h.key, clientv3.WithCountOnly()))
		})
		switch {
		case err != nil && wr.resp == nil:
			p.h.Abandon(ctx)
			return
		case wr.resp.Succeeded || wr.resp.Responses[0].GetResponseRange().Count == 0:
			p.h.released()
			return
		}
	}
	p.h.Abandon(ctx)
}

// Leave deletes p's key and returns once no participant of its round is left (see above).
// On any failure, ctx's end included, it deletes p's key before returning. A loss of the key
// before Leave is its error: ErrLost.
func (b *Barrier) Leave(ctx context.Context, p *Participant) (err error) {
	if err := p.h.Err(); err != nil {
		return err
	}
	x := p.h.Token()
	defer func() {
		if err != nil && p.h.Live() {
			p.h.Abandon(ctx)
		}
	}()
	held := true
	leave := func() error {
		held = false
		_, err := p.h.Release(ctx)
		return err
	}
	for {
		of := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1),
			clientv3.WithMinCreateRev(p.lo + 1), clientv3.WithMaxCreateRev(p.hi)}
		resp, err := readState(ctx, b.q.cli,
			clientv3.OpGet(b.in, append(of, clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))...),
			clientv3.OpGet(b.in, append(of, clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))...))
		if err != nil {
			return err
		}
		first, last := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		var wait *mvccpb.KeyValue
		switch {
		case len(first) == 0 && held:
			return p.h.Err() // its key went
		case len(first) == 0:
			return nil
		case held && first[0].CreateRevision == x && last[0].CreateRevision == x:
			return leave() // the last one there
		case held && first[0].CreateRevision == x:
			wait = last[0] // the first waits for the others, one after another
		case held:
			if err := leave(); err != nil {
				return err
			}
			wait = first[0]
		default:
			wait = first[0]
		}
		var stop <-chan struct{}
		if held {
			stop = p.h.Done()
		}
		if err := b.awaitGone(ctx, wait, stop); err != nil {
			return err
		}
		if held {
			if err := p.h.Err(); err != nil {
				return err
			}
		}
	}
}

// awaitGone returns once the key kv (a participant's, at its create revision) is gone, or
// stop closes: the watch of the key, then a read of whether it is still there.
func (b *Barrier) awaitGone(ctx context.Context, kv *mvccpb.KeyValue, stop <-chan struct{}) error {
	_, err := awaitGone(ctx, b.q.cli, kv, stop, false)
	return err
}

// BarrierPlace is what a barrier's round record (zero or one key) says: the current
// round's number, and, for the participant whose key was created at token, whether it is a
// member of a round filled, and which.
func BarrierPlace(record []*mvccpb.KeyValue, token int64) (current, round int64, member bool, err error) {
	r, err := parseRounds(record)
	if err != nil {
		return 0, 0, false, err
	}
	_, _, round, member, err = r.place(token)
	return r.n, round, member, err
}

// A gate (a barrier's simple form, etcd's recipe Barrier) is one key "<name>/gate" without
// a lease: waiters pass while it is absent. Hold creates it, Release deletes it; a wait
// reads it, and watches it for its delete (see follow.go).

// Gate is the gate of a name.
type Gate struct {
	q   *Queue
	key string
}

// NewGate returns the gate of name, configured by c. It does no I/O.
func NewGate(cli *clientv3.Client, c Config, name string) *Gate {
	q := NewQueue(cli, c, name)
	return &Gate{q: q, key: q.prefix + gateKey}
}

// Queue is the gate's queue (its name and client).
func (g *Gate) Queue() *Queue { return g.q }

// Hold closes the gate: it creates its key, if absent. One Txn, retried through leader
// changes.
func (g *Gate) Hold(ctx context.Context) error {
	if _, err := Record(ctx, g.q.cli, Claim{g.q.prefix, UseGate}, g.key, OwnerValue("")); err != nil {
		return waitErr(ctx, g.q.cli, err)
	}
	return nil
}

// Release opens the gate: it deletes its key. One delete, retried through leader changes.
func (g *Gate) Release(ctx context.Context) error {
	if _, err := retry(ctx, func(ctx context.Context) (*clientv3.DeleteResponse, error) {
		return g.q.cli.Delete(clientv3.WithRequireLeader(ctx), g.key)
	}); err != nil {
		return waitErr(ctx, g.q.cli, err)
	}
	return nil
}

// Wait returns once the gate is open: at once if its key is absent when read.
func (g *Gate) Wait(ctx context.Context) error {
	_, err := follow(ctx, g.q.cli, g.key, nil, func() (int64, verdict, error) {
		resp, err := readState(ctx, g.q.cli, clientv3.OpGet(g.key, clientv3.WithCountOnly()))
		switch {
		case err != nil:
			return 0, stillWaiting, err
		case resp.Responses[0].GetResponseRange().Count == 0:
			return resp.Header.Revision, waitOver, nil
		}
		return resp.Header.Revision, stillWaiting, nil
	}, func(ev *clientv3.Event) (verdict, error) {
		if ev.Type == clientv3.EventTypeDelete {
			return waitOver, nil
		}
		return stillWaiting, nil
	})
	return err
}
