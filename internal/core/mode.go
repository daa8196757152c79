package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hold that changes what it is in place keeps its key, so its place in line and its
// token: a Put keeps a key's create revision. What it is then lives in the key's value, as
// its mode: a last field " mode=<m>" (ModeOf). A key without one is in the mode its kind
// says (a write key without a mode is a writer, as etcd's recipe.RWMutex writes it), so a
// foreign client, which reads only the kind, sees something at least as strong as the truth.
//
// Who passes which mode is the waiter's Spec.Passes: a waiter that passes none (a writer)
// counts every key ahead, whatever its value. One that passes some reads the keys ahead with
// their values, and hears a change of mode on the name's watch as a put of a key that was
// there (an arrivals hub delivers those, with the previous value): the weight ahead of it
// falls when a key ahead comes to pass (a write hold that became a read), and rises when
// one stops passing (an upgradable read that became a write). A waiter already served is
// not affected: what it holds beside is for the changing hold to wait out (Upgrade).

// A change in place is a put of the hold's key, which moves its mod revision. etcd's
// recipe.RWMutex weighs only the keys whose mod revision is below its own key's creation,
// so a waiter of the recipe queued behind the hold that reads the name after the change
// would not see the key at all, and could be served beside it. So a change is refused while
// such a waiter that it would let in is queued behind the hold (a writer of the recipe, or
// a reader too for the put that makes the hold a writer), and every put of a change
// compares, in its Txn, that no key of the name was created after a read that found none
// (recipeBehind).

// ErrRecipeBehind is why a change in place is refused: a waiter of etcd's recipe.RWMutex is
// queued behind the hold. Nothing was written.
var ErrRecipeBehind = fmt.Errorf("%w: a waiter of etcd's recipe.RWMutex is queued behind this hold, and would not see it change in place (the recipe weighs keys by their mod revision)", ErrInvalidOption)

// recipeBehind reports whether kvs, keys of the name under prefix, hold a key of etcd's
// recipe.RWMutex of one of kinds created after rev: under the kind, a decimal time
// ("<kind><ns>"), where etcdsync's keys are "<kind><lease hex>_<slot>". Its writers count
// for a hold that stays a read or becomes one (its readers may hold beside that); its
// readers too for the put that makes the hold a writer.
func recipeBehind(prefix string, kvs []*mvccpb.KeyValue, rev int64, kinds ...string) bool {
	for _, kv := range kvs {
		if kv.CreateRevision > rev && recipeKey(prefix, string(kv.Key), kinds) {
			return true
		}
	}
	return false
}

// recipeKey reports whether key, a key of the name under prefix, is one of etcd's
// recipe.RWMutex of one of kinds.
func recipeKey(prefix, key string, kinds []string) bool {
	shape, ok := ParseKey(strings.TrimPrefix(key, prefix))
	return ok && shape.Recipe && slices.Contains(kinds, shape.Kind)
}

// createdBy is the compare that no key of the name under prefix was created after rev.
func createdBy(prefix string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(prefix), "<", rev+1).WithPrefix()
}

// ChangeMode puts value into h's key, fenced on its create revision and on the revision
// of its last write (so that a try etcd applies late, after a later change, writes
// nothing), and on no key of the name created since a read that found no waiter of etcd's
// recipe behind it (see above); it reads every key of the name with its value in the same
// Txn. It returns those keys, the revision they were read at, and the revision at which the
// key took value (a try whose answer was lost may have applied it). ErrLost, with nothing
// written, once the key is not h's any more; ErrRecipeBehind while a waiter of the recipe is
// queued behind it. One read (keys only) and one Txn, and one more Txn after every arrival
// of a key between a read and the write, retried through leader changes until ctx ends; one
// more if the key was written again after its creation before the hold's first change (an
// acquisition that took over its own key).
func (q *Queue) ChangeMode(ctx context.Context, h *Hold, value string) (kvs []*mvccpb.KeyValue, read, at int64, err error) {
	h.mu.Lock()
	mod, known := h.at, h.at != 0 && !h.near
	h.mu.Unlock()
	if !known {
		mod = h.rev // written once, at its creation, unless taken over
	}
	// A read first: which keys are behind the hold, and whether one is the recipe's.
	resp, err := ReadState(ctx, q.cli, clientv3.OpGet(q.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("change %s: %w", h.key, err)
	}
	if recipeBehind(q.prefix, resp.Responses[0].GetResponseRange().Kvs, h.rev, KindWrite) {
		return nil, 0, 0, fmt.Errorf("change %s: %w", h.key, ErrRecipeBehind)
	}
	seen := resp.Header.Revision // no key created by then is the recipe's
	var b Backoff
	for tries := 1; ; tries++ {
		resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return q.cli.Txn(clientv3.WithRequireLeader(ctx)).
				If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev), clientv3.Compare(clientv3.ModRevision(h.key), "=", mod),
					createdBy(q.prefix, seen)).
				Then(clientv3.OpPut(h.key, value, clientv3.WithLease(h.sess.Lease())), clientv3.OpGet(q.prefix, clientv3.WithPrefix())).
				Else(clientv3.OpGet(q.prefix, clientv3.WithPrefix())).
				Commit()
		})
		if err != nil {
			return nil, 0, 0, fmt.Errorf("change %s: %w", h.key, err)
		}
		kvs = resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs
		own := ownIn(kvs, h)
		switch {
		case own == nil:
			return nil, 0, 0, h.gone()
		case string(own.Value) == value:
			h.wrote(own.ModRevision)
			return kvs, resp.Header.Revision, own.ModRevision, nil
		case own.ModRevision != mod && !known:
			mod, known = own.ModRevision, true // taken over: try from its last write
			continue
		case own.ModRevision != mod: // only its holder writes the key: it cannot be
			return nil, 0, 0, fmt.Errorf("change %s: its value changed under it to %q", h.key, own.Value)
		case recipeBehind(q.prefix, kvs, h.rev, KindWrite): // the hold is, or becomes, a read
			return nil, 0, 0, fmt.Errorf("change %s: %w", h.key, ErrRecipeBehind)
		}
		// Keys came after the last read, none of them the recipe's: again, from this read
		// (at once the first time).
		if tries > 1 {
			if err := b.wait(ctx); err != nil {
				return nil, 0, 0, err
			}
		}
		seen = resp.Header.Revision
	}
}

// wrote records mod as the revision of h's last change of mode.
func (h *Hold) wrote(mod int64) {
	h.mu.Lock()
	h.at, h.near = mod, false
	h.mu.Unlock()
}

// ownIn is h's key among kvs, if it is still h's.
func ownIn(kvs []*mvccpb.KeyValue, h *Hold) *mvccpb.KeyValue {
	for _, kv := range kvs {
		if string(kv.Key) == h.key && kv.CreateRevision == h.rev {
			return kv
		}
	}
	return nil
}

// gone ends h as lost, its key found gone, and returns the loss.
func (h *Hold) gone() error {
	loss := fmt.Errorf("%w: %w", ErrLost, KeyGone(h.key))
	h.Lose(loss)
	return loss
}

// An Upgrade turns an upgradable read into the write hold in place, in two writes, so that
// whoever weighs the keys, at any revision, agrees on which readers it waits for:
//
//  1. Its key's mode becomes ModeUpgrading (ChangeMode), at revision P. A reader created
//     before P still passes it; one created later waits for it.
//  2. It waits until no reader created before P may hold: a read key, or a write key in
//     read mode, that no other write key counted by readers is ahead of. A reader behind
//     such a writer waits for it, and the writer for the upgrade, so it is not waited for.
//     Whether a reader may hold follows from the keys there now (their modes never turn
//     against it while P's upgrade lasts), so a client that missed events and reads the
//     name later decides as the upgrade does.
//  3. One Txn puts the writer's mode, if the key is as step 1 left it and the first writer
//     that kept readers out is still there (if it went, a reader it kept out may be
//     served: the wait goes on). From then on every reader counts the key, and none of
//     those created before P holds.
//
// upgradeBackWait bounds how long a failed Upgrade tries to make its key upgradable again.
const upgradeBackWait = 5 * time.Second

// Upgrade turns h, an upgradable read (UpgradableSpec), into a write hold in place: step 1
// (ChangeMode to upgrading), then steps 2 and 3 (drain). On a failure but a loss, it makes
// the key upgradable again (bounded by upgradeBackWait; if that fails too, the key stays
// upgrading, which keeps new readers out until the hold ends) and returns the failure.
func (q *Queue) Upgrade(ctx context.Context, h *Hold) error {
	value := OwnerValue("")
	kvs, read, at, err := q.ChangeMode(ctx, h, WithMode(value, ModeUpgrading))
	if err == nil {
		err = q.drain(ctx, h, kvs, read, at, ReadSpec(value), value)
	}
	if err != nil && !errors.Is(err, ErrLost) && h.Live() {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), upgradeBackWait)
		_, _, _, _ = q.ChangeMode(bctx, h, UpgradableSpec(value).Value)
		cancel()
	}
	return err
}

// drain does steps 2 and 3, after ChangeMode did step 1 (kvs read at revision read, P at):
// the keys of reader's kind, and the keys in ModeRead, are readers; a key of reader's Ahead
// keeps readers out unless reader passes its mode (one rule with the readers' wait: see
// weigher). It returns nil once the key holds plain; ErrLost when h's key or session goes first; ctx's error. A registration with the
// client's watch on the name (the queue must watch arrivals) and one Txn, again after each
// change that lets a reader in.
func (q *Queue) drain(ctx context.Context, h *Hold, kvs []*mvccpb.KeyValue, read, at int64, reader Spec, plain string) error {
	d := &drainer{view: view{wake: make(chan struct{}, 1)}, own: h.key, rev: h.rev, before: at,
		reads: q.prefix + reader.Kind, ahead: q.prefix + reader.Ahead, weigh: weigher{passes: reader.Passes}}
	d.reset(kvs, read)
	hb := join(q.hubKey(), d)
	defer hb.leave(d)
	for {
		hb.mu.Lock()
		err, stale := d.err, d.stale()
		var open bool
		var guard *drainKey
		if err == nil && !stale {
			open, guard = d.evaluate()
		}
		hb.mu.Unlock()
		switch {
		case err != nil:
			return err
		case stale || open:
			select {
			case <-d.wake:
			case <-h.sess.Done():
				return h.sess.lostErr()
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		hb.mu.Lock()
		behind, known := d.recipeBehind(q.prefix), d.at
		hb.mu.Unlock()
		if behind {
			return fmt.Errorf("upgrade %s: %w", h.key, ErrRecipeBehind)
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev), clientv3.Compare(clientv3.ModRevision(h.key), "=", at),
			createdBy(q.prefix, known)}
		if guard != nil {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(guard.key), "=", guard.created))
		}
		resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return q.cli.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).
				Then(clientv3.OpPut(h.key, plain, clientv3.WithLease(h.sess.Lease()))).
				Else(clientv3.OpGet(q.prefix, clientv3.WithPrefix())).
				Commit()
		})
		switch {
		case err != nil:
			return fmt.Errorf("upgrade %s: %w", h.key, err)
		case resp.Succeeded:
			h.wrote(resp.Header.Revision)
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		own := ownIn(kvs, h)
		switch {
		case own == nil:
			return h.gone()
		case own.ModRevision != at && string(own.Value) == plain:
			h.wrote(own.ModRevision)
			return nil // a try whose answer was lost
		case own.ModRevision != at:
			return fmt.Errorf("upgrade %s: its value changed under it to %q", h.key, own.Value)
		}
		hb.mu.Lock()
		d.reset(kvs, resp.Header.Revision) // the guard went: weigh again
		hb.mu.Unlock()
	}
}

// drainer is an Upgrade's wait as its hub sees it: every key of the name, by name, as of
// its view's revision. Its view's err says the upgrading key went.
type drainer struct {
	view
	own    string  // the upgrading key
	rev    int64   // its create revision
	before int64   // P: the readers created before it are those it waits for
	reads  string  // the read keys' prefix
	ahead  string  // the prefix of the keys a reader waits behind
	weigh  weigher // a reader's: which of those pass
	keys   map[string]drainKey
	at     int64 // every key created at or before it is in keys (or was deleted)
}

// recipeBehind reports whether a key of etcd's recipe.RWMutex, a reader or a writer, is
// queued behind the upgrading key, which is about to become a writer (see ChangeMode). Under the hub's mutex once joined.
func (d *drainer) recipeBehind(prefix string) bool {
	for _, k := range d.keys {
		if k.created > d.rev && recipeKey(prefix, k.key, []string{KindRead, KindWrite}) {
			return true
		}
	}
	return false
}

type drainKey struct {
	key             string
	created, modRev int64
	mode            string
}

// reset takes kvs, every key of the name read at rev, as the view, unless it is older than
// what the view reflects. Under the hub's mutex once joined.
func (d *drainer) reset(kvs []*mvccpb.KeyValue, rev int64) {
	if rev < d.snap {
		return
	}
	d.snap, d.rereading = rev, false
	d.at = max(d.at, rev)
	d.keys = make(map[string]drainKey, len(kvs))
	own := false
	for _, kv := range kvs {
		k := string(kv.Key)
		own = own || k == d.own && kv.CreateRevision == d.rev
		d.keys[k] = drainKey{key: k, created: kv.CreateRevision, modRev: kv.ModRevision, mode: ModeOf(string(kv.Value))}
	}
	if !own {
		d.fail(fmt.Errorf("%w: %w", ErrLost, KeyGone(d.own)))
	}
	signal(d.wake)
}

func (d *drainer) apply(rev int64, evs []event) {
	if d.err != nil {
		return
	}
	d.at = max(d.at, rev)
	for _, e := range evs {
		switch {
		case e.put:
			d.keys[e.key] = drainKey{key: e.key, created: e.created, modRev: e.modRev, mode: e.mode}
		case e.key == d.own:
			d.fail(fmt.Errorf("%w: %w", ErrLost, KeyGone(d.own)))
			return
		default:
			delete(d.keys, e.key)
		}
	}
	signal(d.wake)
}

func (d *drainer) recount(kvs []*mvccpb.KeyValue, rev int64) {
	if d.stale() {
		d.reset(kvs, rev)
	}
}

// evaluate reports whether a reader created before the upgrade may hold (open), and
// otherwise the first writer that keeps readers out, if any reader waits behind it (guard).
func (d *drainer) evaluate() (open bool, guard *drainKey) {
	sorted := slices.SortedFunc(maps.Values(d.keys), func(a, b drainKey) int { return cmp.Compare(a.created, b.created) })
	var first *drainKey
	for _, k := range sorted {
		if k.created >= d.before {
			break
		}
		switch {
		case k.key == d.own:
		case strings.HasPrefix(k.key, d.reads), k.mode == ModeRead:
			if first == nil {
				return true, nil
			}
			guard = first
		case first == nil && strings.HasPrefix(k.key, d.ahead) && !d.weigh.passing(k.mode, k.modRev, d.before-1):
			first = &k
		}
	}
	return false, guard
}
