package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Snapshot is the queue of every name read, at one revision.
type Snapshot struct {
	Revision int64        `json:"revision"`
	Names    []NameStatus `json:"names"`
}

// NameStatus is the queue of one name, in the order its holders are served.
type NameStatus struct {
	Name      string `json:"name"`
	Prefix    string `json:"prefix"`          // where its keys live
	Primitive string `json:"primitive"`       // lock, election, rwmutex, semaphore, barrier, gate, latch; "" without keys
	Limit     *int   `json:"limit,omitempty"` // a semaphore's, from its limit record
	// Size is a barrier's participants per round, or the count a latch was set to; Round a
	// barrier's current round (the next to fill); Count a latch's count now.
	Size  *int    `json:"size,omitempty"`
	Round *int64  `json:"round,omitempty"`
	Count *int    `json:"count,omitempty"`
	Queue []Entry `json:"queue"`
}

// Entry is one holder or waiter: one key.
type Entry struct {
	Position int               `json:"position"`        // 1 is served first
	Kind     string            `json:"kind"`            // read, write, permit, candidate, lock, participant or gate
	Units    int               `json:"units,omitempty"` // a permit's, when more than one
	State    string            `json:"state"`           // holds, leads (a candidate that holds), entered (a participant of a round filled), waits, unknown
	Key      string            `json:"key"`
	Token    int64             `json:"token"`           // the key's create revision
	Lease    string            `json:"lease,omitempty"` // hex, as in the key
	TTL      *int64            `json:"ttl,omitempty"`   // seconds the lease has left; -1 expired; absent if unknown
	Owner    map[string]string `json:"owner"`           // the value's key=value fields; null if it names no owner
	Value    string            `json:"value"`
	// Mode is what a write key's hold is now, when it changed in place: "read" (a
	// downgraded write hold), "upgradable" (an upgradable read) or "upgrading" (one whose
	// Upgrade waits for the readers admitted before it); "" for a writer.
	Mode string `json:"mode,omitempty"`
	// Asked is the ask that this key let go (Ask), while its record is there; nil for none.
	Asked *Record `json:"asked,omitempty"`

	LeaseID clientv3.LeaseID `json:"-"` // the lease, 0 for none
	modRev  int64            // the revision its value was written at
}

// The kinds of key under a name, and their states.
const (
	KindRead      = "read"
	KindWrite     = "write"
	KindPermit    = "permit"
	KindLock      = "lock"
	KindCandidate = "candidate"
	// A barrier's participant, and a gate's key (see package barrier).
	KindParticipant = "participant"
	KindGate        = "gate"

	StateHolds   = "holds"
	StateLeads   = "leads"
	StateEntered = "entered"
	StateWaits   = "waits"
	StateUnknown = "unknown"
)

// read reads the names (or the names findNames finds under the prefix if names is empty) at
// one revision, then the TTL of each distinct lease: one LeaseTimeToLive per lease.
func (c config) read(ctx context.Context, cli *clientv3.Client, names []string) (*Snapshot, error) {
	prefix, exclusive := c.prefix, c.exclusive
	var targets []nameRange
	var rev int64
	if len(names) > 0 {
		for _, n := range names {
			targets = append(targets, nameRange{name: n, keyPrefix: c.keyPrefix(n)})
		}
	} else {
		var err error
		if targets, rev, err = findNames(ctx, cli, prefix); err != nil {
			return nil, err
		}
	}
	keyPrefixes, askPrefixes := make([]string, len(targets)), make([]string, len(targets))
	for i, t := range targets {
		keyPrefixes[i], askPrefixes[i] = t.keyPrefix, askPrefix(t.keyPrefix)
	}
	kvsOf, rev, err := readRanges(ctx, cli, keyPrefixes, rev)
	if err != nil {
		return nil, err
	}
	// The asks beside the names, at the same revision; out of reach of a grant of the names'
	// keys alone, and then not shown.
	asksOf, _, err := readRanges(ctx, cli, askPrefixes, rev)
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		asksOf, err = make([][]*mvccpb.KeyValue, len(targets)), nil
	}
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{Revision: rev, Names: []NameStatus{}}
	for i, t := range targets {
		if len(names) == 0 && !hasSyncKeys(t.keyPrefix, kvsOf[i]) {
			continue // found by the shape of its keys, but they are other data
		}
		ns := queueOf(t.name, t.keyPrefix, kvsOf[i], exclusive)
		noteAsks(&ns, asksOf[i])
		snap.Names = append(snap.Names, ns)
	}
	if err := readTTLs(ctx, cli, snap); err != nil {
		return nil, err
	}
	return snap, nil
}

// askPrefix is where the records of asks of the keys under keyPrefix lie (Ask).
func askPrefix(keyPrefix string) string { return core.AskRecordKey(keyPrefix, keyPrefix) }

// noteAsks gives each entry of ns the ask among asks, records read beside its name, that
// names its key and token.
func noteAsks(ns *NameStatus, asks []*mvccpb.KeyValue) {
	for _, kv := range asks {
		var rec Record
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		key := ns.Prefix + strings.TrimPrefix(string(kv.Key), askPrefix(ns.Prefix))
		for i := range ns.Queue {
			if e := &ns.Queue[i]; e.Key == key && e.Token == rec.Token {
				e.Asked = &rec
			}
		}
	}
}

// nameRange is a name and where its keys are.
type nameRange struct {
	name      string
	keyPrefix string
}

// rangesOf is what status watches: the key prefix of each name, or all of prefix without
// names.
func (c config) rangesOf(names []string) []string {
	if len(names) == 0 {
		return []string{c.prefix}
	}
	ranges := make([]string, len(names))
	for i, n := range names {
		ranges[i] = c.keyPrefix(n)
	}
	return ranges
}

// maxOpsPerTxn is how many ranges readRanges reads in one Txn at first: etcd refuses a Txn of
// more than its --max-txn-ops (128 by default).
const maxOpsPerTxn = 100

// readRanges reads the keys under each of prefixes, at revision rev (0: the present), and
// returns them with the revision read. It reads in Txns of up to maxOpsPerTxn ranges, every
// one after the first at the first's revision, so that the whole is one consistent view.
// When etcd refuses a Txn as too large (a server started with a lower --max-txn-ops), it
// tries again with pieces half as large, down to single Ranges, which need no Txn.
func readRanges(ctx context.Context, cli *clientv3.Client, prefixes []string, rev int64) ([][]*mvccpb.KeyValue, int64, error) {
	kvsOf := make([][]*mvccpb.KeyValue, 0, len(prefixes))
	piece := maxOpsPerTxn
	for len(kvsOf) < len(prefixes) {
		chunk := prefixes[len(kvsOf):min(len(prefixes), len(kvsOf)+piece)]
		ops := make([]clientv3.Op, len(chunk))
		for i, p := range chunk {
			opts := []clientv3.OpOption{clientv3.WithPrefix()}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			ops[i] = clientv3.OpGet(p, opts...)
		}
		var ranges []*clientv3.GetResponse
		if len(ops) == 1 {
			resp, err := cli.Do(clientv3.WithRequireLeader(ctx), ops[0])
			if err != nil {
				return nil, 0, fmt.Errorf("read %s: %w", chunk[0], err)
			}
			ranges = append(ranges, resp.Get())
		} else {
			resp, err := cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
			if errors.Is(err, rpctypes.ErrTooManyOps) {
				piece = max(1, len(ops)/2)
				continue
			}
			if err != nil {
				return nil, 0, fmt.Errorf("read %s: %w", strings.Join(chunk, ", "), err)
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			for _, r := range resp.Responses {
				ranges = append(ranges, (*clientv3.GetResponse)(r.GetResponseRange()))
			}
		}
		for _, r := range ranges {
			if rev == 0 {
				rev = r.Header.Revision
			}
			kvsOf = append(kvsOf, r.Kvs)
		}
	}
	return kvsOf, rev, nil
}

// queueOf orders the keys of one name by create revision and decides who holds, by the
// rules of the primitives: an exclusive key (lock, candidate, write) holds when no key is
// ahead of it; a read key when no write or exclusive key is; a permit when its units fit
// within the limit beside those of the permits ahead of it.
func queueOf(name, keyPrefix string, kvs []*mvccpb.KeyValue, exclusive string) NameStatus {
	ns := NameStatus{Name: name, Prefix: keyPrefix, Queue: []Entry{}}
	kinds := map[string]bool{}
	gathering := gatheringOf(&ns, keyPrefix, kvs)
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), keyPrefix)
		if gathering[string(kv.Key)] {
			continue
		}
		if core.IsRecord(rest) {
			if limit, err := strconv.Atoi(string(kv.Value)); err == nil && rest == core.RecordLimit {
				ns.Limit = &limit
			}
			kinds[KindPermit] = true
			continue
		}
		kind := exclusive
		switch core.KindOf(rest) {
		case core.KindRead:
			kind = KindRead
		case core.KindWrite:
			kind = KindWrite
		case core.KindPermit:
			kind = KindPermit
		}
		kinds[kind] = true
		units := 0
		if n := core.KeyUnits(keyPrefix+core.KindPermit, string(kv.Key)); kind == KindPermit && n > 1 {
			units = n
		}
		ns.Queue = append(ns.Queue, Entry{
			Kind:    kind,
			Units:   units,
			Key:     string(kv.Key),
			Token:   kv.CreateRevision,
			Value:   string(kv.Value),
			Mode:    modeOf(kind, string(kv.Value)),
			modRev:  kv.ModRevision,
			Owner:   parseOwner(string(kv.Value)),
			LeaseID: clientv3.LeaseID(kv.Lease),
		})
	}
	switch {
	case kinds[KindRead] || kinds[KindWrite]:
		ns.Primitive = "rwmutex"
	case kinds[KindPermit]:
		ns.Primitive = "semaphore"
	case kinds[KindCandidate]:
		ns.Primitive = "election"
	case kinds[KindLock]:
		ns.Primitive = "lock"
	}
	if ns.Primitive == "" {
		ns.Primitive = gatheringPrimitive(&ns)
	}
	slices.SortFunc(ns.Queue, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Token, b.Token), strings.Compare(a.Key, b.Key))
	})
	keys := make([]core.QueuedKey, len(ns.Queue))
	specs := make(map[string]core.Spec, len(ns.Queue))
	for i, e := range ns.Queue {
		keys[i] = core.QueuedKey{Key: e.Key, Created: e.Token, ModRev: e.modRev, Mode: e.Mode}
		limit := 0
		if ns.Limit != nil {
			limit = *ns.Limit
		}
		if s, ok := core.SpecOfKey(strings.TrimPrefix(e.Key, keyPrefix), e.Value, limit); ok {
			specs[e.Key] = s
		}
	}
	heldThrough := core.Watermark(keyPrefix, kvs) // permits held beyond a lowered limit
	served := core.Served(keyPrefix, keys, func(rel, _ string) (core.Spec, bool) {
		s, ok := specs[keyPrefix+rel]
		return s, ok
	})
	for i := range ns.Queue {
		e := &ns.Queue[i]
		e.Position = i + 1
		if e.LeaseID != 0 {
			e.Lease = fmt.Sprintf("%x", int64(e.LeaseID))
		}
		if e.Kind == KindPermit && ns.Limit == nil {
			e.State = StateUnknown
		}
		holds := served[i] || e.Kind == KindPermit && e.Token <= heldThrough
		switch {
		case e.State != "":
		case e.Kind == KindGate:
			e.State = StateHolds
		case holds && e.Kind == KindCandidate:
			e.State = StateLeads
		case holds:
			e.State = StateHolds
		default:
			e.State = StateWaits
		}
	}
	return ns
}

// modeOf is the mode of a key of kind with value: a write key's, else none.
func modeOf(kind, value string) string {
	if kind != KindWrite {
		return ""
	}
	return core.ModeOf(value)
}

// readTTLs fills in the TTL each key's lease has left: one LeaseTimeToLive per lease. A lease
// etcd will not tell about (a permission) has no TTL shown; it is no error.
func readTTLs(ctx context.Context, cli *clientv3.Client, snap *Snapshot) error {
	ttls := map[clientv3.LeaseID]*int64{}
	for i := range snap.Names {
		for j := range snap.Names[i].Queue {
			e := &snap.Names[i].Queue[j]
			if e.LeaseID == 0 {
				continue
			}
			ttl, seen := ttls[e.LeaseID]
			if !seen {
				resp, err := cli.TimeToLive(clientv3.WithRequireLeader(ctx), e.LeaseID)
				if ctx.Err() != nil {
					return fmt.Errorf("read the TTL of lease %x: %w", int64(e.LeaseID), ctx.Err())
				}
				if err == nil {
					ttl = &resp.TTL
				}
				ttls[e.LeaseID] = ttl
			}
			e.TTL = ttl
		}
	}
	return nil
}

// parseOwner reads the owner a key's value describes: space-separated key=value fields, of
// which host, pid and since name the owner ("host=web-3 pid=4711 since=2026-11-24T07:00:00Z",
// perhaps with more, such as owner=<uuid>). nil if the value has none of those three.
func parseOwner(value string) map[string]string {
	fields := map[string]string{}
	for f := range strings.FieldsSeq(value) {
		if k, v, ok := strings.Cut(f, "="); ok && k != "" {
			fields[k] = v
		}
	}
	for _, k := range []string{"host", "pid", "since"} {
		if _, ok := fields[k]; ok {
			return fields
		}
	}
	return nil
}

// gatheringOf reads the keys of a barrier, a gate or a latch among kvs, the keys of one
// name: it fills in ns's records (Size, Round, Count) and adds an entry for each
// participant (entered if its round filled, by the round record) and for a gate held. It
// returns the keys it took, which are no lock's.
func gatheringOf(ns *NameStatus, keyPrefix string, kvs []*mvccpb.KeyValue) map[string]bool {
	taken := map[string]bool{}
	var round []*mvccpb.KeyValue
	var latch *mvccpb.KeyValue
	markers := 0
	var participants []*mvccpb.KeyValue
	for _, kv := range kvs {
		key := string(kv.Key)
		switch rest := strings.TrimPrefix(key, keyPrefix); {
		case kv.Lease == 0 && rest == core.RecordRound:
			round = []*mvccpb.KeyValue{kv}
		case kv.Lease == 0 && rest == core.RecordSize:
			if n, err := strconv.Atoi(string(kv.Value)); err == nil {
				ns.Size = &n
			}
		case kv.Lease == 0 && rest == core.LatchKey:
			latch = kv
		case kv.Lease == 0 && strings.HasPrefix(rest, core.LatchKey+"/"):
			markers++
		case kv.Lease == 0 && rest == core.GateKey:
			ns.Queue = append(ns.Queue, Entry{Kind: KindGate, Key: key, Token: kv.CreateRevision, Value: string(kv.Value), Owner: parseOwner(string(kv.Value))})
		case kv.Lease != 0 && strings.HasPrefix(rest, core.KindParticipant):
			participants = append(participants, kv)
		default:
			continue
		}
		taken[key] = true
	}
	if latch != nil {
		if set, now, err := core.LatchCount(latch, markers); err == nil {
			ns.Size, ns.Count = &set, &now
		}
	}
	if round != nil || ns.Size != nil && latch == nil {
		current, _, _, _ := core.BarrierPlace(round, 0)
		ns.Round = &current
	}
	for _, kv := range participants {
		e := Entry{Kind: KindParticipant, Key: string(kv.Key), Token: kv.CreateRevision, Value: string(kv.Value),
			Owner: parseOwner(string(kv.Value)), LeaseID: clientv3.LeaseID(kv.Lease), State: StateWaits}
		if _, _, member, err := core.BarrierPlace(round, kv.CreateRevision); err == nil && member {
			e.State = StateEntered
		}
		ns.Queue = append(ns.Queue, e)
	}
	return taken
}

// gatheringPrimitive is what gatheringOf found a name to be: barrier, gate, latch, or "".
func gatheringPrimitive(ns *NameStatus) string {
	switch {
	case ns.Count != nil:
		return "latch"
	case ns.Round != nil || slices.ContainsFunc(ns.Queue, func(e Entry) bool { return e.Kind == KindParticipant }):
		return "barrier"
	case slices.ContainsFunc(ns.Queue, func(e Entry) bool { return e.Kind == KindGate }):
		return "gate"
	}
	return ""
}
