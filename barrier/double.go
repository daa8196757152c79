package barrier

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// A double barrier's participants are keys under "<name>/in/" on their sessions' leases,
// ordered by create revision; its rounds are slices of those, the record "<name>/round"
// says where each filled, and "<name>/size" says n (the layout: internal/core, barrier.go).
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

// double is the double barrier of n participants on a name, as above.
type double struct {
	q          *core.Queue
	n          int
	in         string // the prefix of the participants' keys
	round, sz  string // the records' keys
	lastCutoff int64  // a guess at the last cutoff, to start the first read with
}

// newDouble returns the double barrier of n participants on name, configured by c. It does
// no I/O.
func newDouble(cli *clientv3.Client, c core.Config, name string, n int) *double {
	q := core.NewQueue(cli, c, name)
	p := q.Prefix()
	return &double{q: q, n: n, in: p + core.KindParticipant, round: p + core.RecordRound, sz: p + core.RecordSize}
}

// participant is one participant's key and, once it entered, its round.
type participant struct {
	h      *core.Hold
	lo, hi int64 // its round: the participants created after lo through hi
	round  int64 // its round's number, from 1
}

// enter writes a participant's key and returns once its round filled. On any failure,
// ctx's end included, it deletes the key (see withdraw) before returning.
func (b *double) enter(ctx context.Context) (*participant, error) {
	size := strconv.Itoa(b.n)
	spec := core.Spec{Kind: core.KindParticipant, Ahead: core.KindParticipant, Value: core.OwnerValue(""), Use: core.UseBarrier,
		Guard: []clientv3.Cmp{clientv3.Compare(clientv3.Value(b.sz), "=", size)}}
	h, err := b.q.Join(ctx, spec)
	if errors.Is(err, core.ErrGuard) { // no size recorded yet, or another
		stored, rerr := core.Record(ctx, b.q.Client(), core.Claim{Prefix: b.q.Prefix(), Use: core.UseBarrier}, b.sz, size)
		switch {
		case rerr != nil:
			return nil, core.WaitErr(ctx, b.q.Client(), rerr)
		case stored != size:
			return nil, fmt.Errorf("%w: the barrier on this name has %s participants, not %d", ErrInvalidOption, stored, b.n)
		}
		h, err = b.q.Join(ctx, spec)
	}
	if err != nil {
		if errors.Is(err, core.ErrGuard) {
			err = fmt.Errorf("%w: the barrier's size record changed under this Enter", ErrInvalidOption)
		}
		return nil, err
	}
	p := &participant{h: h}
	if err := b.await(ctx, p); err != nil {
		b.withdraw(ctx, p)
		return nil, err
	}
	return p, nil
}

// snapshot is one read of the round record and of the first n participants after lo.
type snapshot struct {
	r     core.Rounds
	mod   int64 // the record's mod revision; 0 without one
	after []*mvccpb.KeyValue
	rev   int64
}

func (b *double) read(ctx context.Context, lo int64) (snapshot, error) {
	resp, err := core.ReadState(ctx, b.q.Client(),
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
	s.r, err = core.ParseRounds(rkvs)
	return s, err
}

// await returns once p's round filled, filling it if p reads that it has n participants:
// it watches the round record, then reads (check), and takes each change of the record.
func (b *double) await(ctx context.Context, p *participant) error {
	x := p.h.Token()
	joined := func(l, hi, round int64) {
		p.lo, p.hi, p.round = l, hi, round
	}
	check := func() (int64, core.Verdict, error) {
		lo := b.lastCutoff
		for {
			s, err := b.read(ctx, lo)
			if err != nil {
				return 0, core.StillWaiting, err
			}
			l, hi, round, member, err := s.r.Place(x)
			switch {
			case err != nil:
				return 0, core.StillWaiting, err
			case member:
				joined(l, hi, round)
				return s.rev, core.WaitOver, nil
			case l != lo: // the read began at the wrong cutoff: again from the right one
				lo, b.lastCutoff = l, l
				continue
			case len(s.after) >= b.n:
				// Fill it; the record's change, whoever made it, is the next event.
				next := s.r.Filled(s.after[b.n-1].CreateRevision).String()
				if _, err := core.CommitWrite(ctx, b.q.Client(), func(t clientv3.Txn) clientv3.Txn {
					return t.If(clientv3.Compare(clientv3.ModRevision(b.round), "=", s.mod)).
						Then(clientv3.OpPut(b.round, next))
				}); err != nil {
					return 0, core.StillWaiting, core.WaitErr(ctx, b.q.Client(), err)
				}
			}
			return s.rev, core.StillWaiting, nil
		}
	}
	each := func(ev *clientv3.Event) (core.Verdict, error) {
		if ev.Type == clientv3.EventTypePut {
			r, err := core.ParseRounds([]*mvccpb.KeyValue{ev.Kv})
			if err != nil {
				return core.StillWaiting, err
			}
			if l, hi, round, member, err := r.Place(x); err == nil && member {
				joined(l, hi, round)
				return core.WaitOver, nil
			}
		}
		return core.ReadAgain, nil // a withdrawal, a round before p's filled, the record deleted
	}
	for {
		if err := p.h.Err(); err != nil {
			return err
		}
		ok, err := core.Follow(ctx, b.q.Client(), b.round, p.h.Done(), check, each)
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
func (b *double) withdraw(ctx context.Context, p *participant) {
	dctx, cancel := core.Detached(ctx)
	defer cancel()
	x := p.h.Token()
	for p.h.Live() && dctx.Err() == nil {
		resp, err := core.ReadState(dctx, b.q.Client(), clientv3.OpGet(b.round))
		if err != nil {
			break
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		r, err := core.ParseRounds(kvs)
		if err != nil {
			break
		}
		if _, _, _, member, _ := r.Place(x); member {
			break // counted: it leaves
		}
		var mod int64
		if len(kvs) == 1 {
			mod = kvs[0].ModRevision
		}
		wr, err := core.CommitWrite(dctx, b.q.Client(), func(t clientv3.Txn) clientv3.Txn {
			return t.If(
				clientv3.Compare(clientv3.ModRevision(b.round), "=", mod),
				clientv3.Compare(clientv3.CreateRevision(p.h.Key()), "=", x),
			).Then(clientv3.OpDelete(p.h.Key()), clientv3.OpPut(b.round, r.String())).
				Else(clientv3.OpGet(p.h.Key(), clientv3.WithCountOnly()))
		})
		switch {
		case err != nil && wr.Resp == nil:
			p.h.Abandon(ctx)
			return
		case wr.Resp.Succeeded || wr.Resp.Responses[0].GetResponseRange().Count == 0:
			p.h.Released()
			return
		}
	}
	p.h.Abandon(ctx)
}

// leave deletes p's key and returns once no participant of its round is left (see above).
// On any failure, ctx's end included, it deletes p's key before returning. A loss of the key
// before Leave is its error: ErrLost.
func (b *double) leave(ctx context.Context, p *participant) (err error) {
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
		resp, err := core.ReadState(ctx, b.q.Client(),
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
		if _, err := core.AwaitGone(ctx, b.q.Client(), wait, stop, false); err != nil {
			return err
		}
		if held {
			if err := p.h.Err(); err != nil {
				return err
			}
		}
	}
}
