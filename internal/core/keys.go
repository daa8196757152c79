package core

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxNameLen is the longest name, in bytes.
const MaxNameLen = 512

// The key layout: the sub-ranges and records under a name's prefix, every one the
// primitives use, written here once. An exclusive lock's (mutex, reentrant, election) keys
// lie directly under the name's prefix; the records beside a name that must never be
// mistaken for one of its keys (a handover's, an operator's release) are under the name
// itself and a NUL byte (HandoverRecordKey, ReleaseRecordKey).
const (
	KindRead    = "read/"   // rwmutex readers
	KindWrite   = "write/"  // rwmutex writers
	KindPermit  = "permit/" // semaphore permits
	RecordLimit = "limit"   // the semaphore's limit record
	// LimitMark starts the key of a limit's marker (the limit in force while it changes).
	LimitMark = RecordLimit + "/"
	// unitsMark starts the sub-prefix of a kind's keys of more than one unit (see unitsKind).
	unitsMark = "u"

	kindIn      = "in/"   // a double barrier's participants
	roundRecord = "round" // a double barrier's record of rounds
	sizeRecord  = "size"  // a double barrier's size
	gateKey     = "gate"  // a gate, a barrier's simple form
	latchKey    = "latch" // a latch's record; its markers are under latchKey + "/"
)

// The keys of a barrier, a gate and a latch, under the names admin reads them by.
const (
	KindParticipant = kindIn
	RecordRound     = roundRecord
	RecordSize      = sizeRecord
	GateKey         = gateKey
	LatchKey        = latchKey
)

// MaxUnits is the highest limit of a semaphore, and so the most units one permit takes:
// the units of a permit are in its key (see unitsKind), read back as a 32-bit number, and
// the units of every key ahead of a waiter are summed in an int, which no count of keys
// etcd can hold makes overflow on a 64-bit platform.
const MaxUnits = 1<<31 - 1

// KeyShape is what a holder's or waiter's key says by its shape alone (ParseKey).
type KeyShape struct {
	Kind   string // KindRead, KindWrite, KindPermit, KindParticipant, or "" for a key directly under the name (a lock's, a candidate's)
	Units  int    // what it weighs: a permit's n under "u<n>/", else 1
	Recipe bool   // etcd's recipe.RWMutex wrote it: a read or write key without a slot
}

// KindOf is the kind of the key rest (relative to its name's prefix), by the sub-range it
// lies in, as waiters weigh keys: KindRead, KindWrite, KindPermit, KindParticipant, or ""
// for a key directly under the name.
func KindOf(rest string) string {
	for _, kind := range []string{KindRead, KindWrite, KindPermit, KindParticipant} {
		if strings.HasPrefix(rest, kind) {
			return kind
		}
	}
	return ""
}

// ParseKey reads rest, a key relative to its name's prefix, as a holder's or waiter's key:
// its kind, then for a permit of n > 1 units "u<n>/", then a lease in hex with "_" and a
// slot in decimal (etcdsync), or without them (etcd's Mutex and Election, etcdctl; under
// read/ and write/, etcd's recipe.RWMutex, whose time in decimal reads as hex too). False
// for anything else: a record, a marker, data that is not a primitive's.
func ParseKey(rest string) (KeyShape, bool) {
	shape := KeyShape{Units: 1, Kind: KindOf(rest)}
	rest = rest[len(shape.Kind):]
	if shape.Kind == KindPermit {
		if units, r, ok := strings.Cut(rest, "/"); ok {
			v, ok := unitsOf(units)
			if !ok {
				return KeyShape{}, false
			}
			shape.Units, rest = v, r
		}
	}
	id, slot, hasSlot := strings.Cut(rest, "_")
	if !allOf(id, "0123456789abcdef") || hasSlot && !allOf(slot, "0123456789") {
		return KeyShape{}, false
	}
	shape.Recipe = !hasSlot && (shape.Kind == KindRead || shape.Kind == KindWrite)
	return shape, true
}

// unitsOf reads the units a permit's key of more than one unit says: s is unitsMark and n,
// 2 to MaxUnits, written as strconv.Itoa writes it. The one reading of it, for ParseKey and
// the weight of a key ahead (weigher).
func unitsOf(s string) (int, bool) {
	n, found := strings.CutPrefix(s, unitsMark)
	v, err := strconv.Atoi(n)
	return v, found && err == nil && v >= 2 && v <= MaxUnits && strconv.Itoa(v) == n
}

// allOf reports whether s is not empty and has only bytes of set.
func allOf(s, set string) bool { return s != "" && strings.Trim(s, set) == "" }

// ValidateName reports, wrapped around ErrInvalidName, why name cannot be used.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if why := invalidString(name); why != "" {
		return fmt.Errorf("%w: %s", ErrInvalidName, why)
	}
	return nil
}

// validPrefix reports, wrapped around ErrInvalidOption, why WithPrefix cannot take p.
func validPrefix(p string) error {
	if !strings.HasSuffix(p, "/") {
		return fmt.Errorf("%w: prefix %q does not end with '/'", ErrInvalidOption, p)
	}
	if why := invalidString(p); why != "" {
		return fmt.Errorf("%w: prefix %s", ErrInvalidOption, why)
	}
	return nil
}

// invalidString says why s cannot be part of a key, or "" when it can.
func invalidString(s string) string {
	switch {
	case len(s) > MaxNameLen:
		return fmt.Sprintf("%d bytes, more than %d", len(s), MaxNameLen)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Sprintf("%q holds a NUL byte", s)
	case !utf8.ValidString(s):
		return fmt.Sprintf("%q is not valid UTF-8", s)
	}
	return ""
}

// nameEscaper makes a name free of '/', so that the prefix "<escaped>/" of one name never
// holds another name's keys ("a" vs "a/b"), and keeps a name without '%' and '/' as it is,
// so that such names share the key layout of etcd's concurrency.Mutex and `etcdctl lock`.
var nameEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// NamePrefix is the key prefix that holds every key of name: the escaped name and a '/'.
func NamePrefix(name string) string { return nameEscaper.Replace(name) + "/" }

// UnescapeName is the name whose NamePrefix is escaped + "/".
func UnescapeName(escaped string) string { return nameUnescaper.Replace(escaped) }

var nameUnescaper = strings.NewReplacer("%2F", "/", "%25", "%")

// An acquisition's key is "<stem>_<slot>", where the stem is the name prefix, the kind and
// the lease in hex, and the slot is the lowest number no other acquisition of this process
// has claimed under the same stem. Keys are thus unique among live acquisitions (a lease
// belongs to one process) and are reused from one acquisition to the next.
//
// A slot stays claimed until its key is known to be gone from etcd: released, found
// deleted, or gone with its lease. A cleanup that could not reach etcd keeps it (see
// janitor), so that a delete of the old key that etcd applies late can never take the key
// of the slot's next acquisition.
//
// Reuse matters for speed: etcd keeps a deleted key in its index until the next compaction,
// and every range over the name walks those tombstones. With a fresh key per acquisition
// (a random suffix), a busy lock slows down with every cycle until a compaction; with reused
// keys the index holds one entry per slot.
var (
	slotsMu    sync.Mutex
	slotsInUse = map[string][]bool{} // by stem; an entry goes when its last slot is freed
)

// slot is one acquisition's claim on a key.
type slot struct {
	k    string // the key: the stem, "_", the slot's number
	name int    // the length of the name's key prefix in k (NamePrefix, after WithPrefix's)
	stem int    // the length of the stem in k
	n    int
	sess *Session
	once sync.Once
}

func claimSlot(prefix, kind string, sess *Session) *slot {
	stem := make([]byte, 0, len(prefix)+len(kind)+24)
	stem = append(append(stem, prefix...), kind...)
	stem = strconv.AppendInt(stem, int64(sess.Lease()), 16)
	sess.claim()
	slotsMu.Lock()
	defer slotsMu.Unlock()
	used := slotsInUse[string(stem)]
	n := 0
	for n < len(used) && used[n] {
		n++
	}
	if n == len(used) {
		used = append(used, true)
	} else {
		used[n] = true
	}
	k := string(strconv.AppendInt(append(stem, '_'), int64(n), 10))
	slotsInUse[k[:len(stem)]] = used // the stem, without a string of its own
	return &slot{k: k, name: len(prefix), stem: len(stem), n: n, sess: sess}
}

// key is the slot's key.
func (s *slot) key() string { return s.k }

// free gives the slot back once its key is known to be gone; only the first call counts.
// A slot of a resumed hold (stem < 0) is in no table: its session's claim alone goes.
func (s *slot) free() {
	s.once.Do(func() {
		if s.stem < 0 {
			s.sess.unclaim()
			return
		}
		slotsMu.Lock()
		stem := s.k[:s.stem]
		used := slotsInUse[stem]
		used[s.n] = false
		for len(used) > 0 && !used[len(used)-1] {
			used = used[:len(used)-1]
		}
		if len(used) == 0 {
			delete(slotsInUse, stem)
		} else {
			slotsInUse[stem] = used
		}
		slotsMu.Unlock()
		s.sess.unclaim()
	})
}

// detach gives up the slot's claim on its session and keeps its number taken for good: its
// key was moved to a lease of its own (Detach) and may live on, so no later acquisition of
// this process may name it. Only the first call of detach or free counts.
func (s *slot) detach() { s.once.Do(func() { s.sess.unclaim() }) }

// processOwner names this process: "host=H pid=P".
var processOwner = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("host=%s pid=%d", host, os.Getpid())
})

// OwnerValue is the value of an acquisition's key, written in the same Txn at no extra
// cost, so that `etcdctl get` and `etcdsync status` show who holds or waits and since when:
// "host=H pid=P since=T", T in RFC 3339, UTC, to the second; extra, if not empty, follows
// (" owner=<uuid>").
func OwnerValue(extra string) string {
	v := processOwner() + " since=" + time.Now().UTC().Format(time.RFC3339)
	if extra != "" {
		v += " " + extra
	}
	return v
}

// What a name is used as. Each use owns sub-ranges of the name's prefix (its keys and its
// records; etcd's own concurrency and recipes put theirs in the same places), and a write of
// one use compares, in its Txn, that no key lies under the name outside the ranges it owns
// (Claim.Guard). So a lock never waits behind a semaphore's limit record, which has no lease
// and would stay ahead of every new key for good, nor behind another use's keys: it fails
// at once, having written nothing, with ErrOtherKind naming what it found. The guard is
// compares only: it costs no op and no read while the name is used one way.
//
// A lock's keys (mutex, reentrant, Multi, etcd's Mutex and `etcdctl lock`) are
// "<lease hex>[_<slot>]", which start with a digit or a..f; every other use's sub-ranges
// start with a letter after f, so a lock owns everything below "g".

// Use is what a name is used as.
type Use uint8

const (
	UseLock      Use = iota + 1 // mutex, reentrant, mutex.Multi; etcd's Mutex
	UseElection                 // election; etcd's Election
	UseRWLock                   // rwmutex; etcd's recipe.RWMutex
	UseSemaphore                // semaphore
	UseBarrier                  // barrier's double barrier
	UseGate                     // barrier.Gate
	UseLatch                    // latch
)

var useNames = [...]string{UseLock: "lock", UseElection: "election", UseRWLock: "rwlock",
	UseSemaphore: "semaphore", UseBarrier: "barrier", UseGate: "gate", UseLatch: "latch"}

func (u Use) String() string {
	if int(u) < len(useNames) && useNames[u] != "" {
		return useNames[u]
	}
	return "unknown"
}

// span is a sub-range of a name's prefix, [from, to) relative to it; to "" is the end of
// the prefix's range.
type span struct{ from, to string }

// end is the end of the span's range under prefix.
func (s span) end(prefix string) string {
	if s.to == "" {
		return clientv3.GetPrefixRangeEnd(prefix)
	}
	return prefix + s.to
}

// ownedBy are the sub-ranges each use owns.
var ownedBy = map[Use][]span{
	UseLock:      {{"", "g"}},
	UseElection:  {{"", "g"}, {"p0", "p:"}}, // and its candidates with a preference, "p<n>/"
	UseRWLock:    {{KindRead, "read0"}, {KindWrite, "write0"}},
	UseSemaphore: {{RecordLimit, "limit0"}, {KindPermit, "permit0"}}, // its record, markers, permits
	UseBarrier:   {{kindIn, "in0"}, {roundRecord, roundRecord + "\x00"}, {sizeRecord, sizeRecord + "\x00"}},
	UseGate:      {{gateKey, gateKey + "\x00"}},
	UseLatch:     {{latchKey, "latch0"}}, // its record and markers, "latch/<participant>"
}

// foreign are the sub-ranges of a name that u does not own, in key order.
func (u Use) foreign() []span {
	var out []span
	at := ""
	for _, s := range ownedBy[u] {
		if s.from > at {
			out = append(out, span{at, s.from})
		}
		at = s.to
	}
	return append(out, span{at, ""})
}

// UseOf is the use that owns rest, a key relative to its name's prefix; 0 for none. A
// lock's keys are told as a lock's (an election's candidates are laid out alike).
func UseOf(rest string) Use {
	for _, u := range []Use{UseLock, UseRWLock, UseSemaphore, UseBarrier, UseGate, UseLatch, UseElection} {
		for _, s := range ownedBy[u] {
			if rest >= s.from && (s.to == "" || rest < s.to) {
				return u
			}
		}
	}
	return 0
}

// ErrOtherKind: the name holds keys or records of another kind of primitive (a
// semaphore's limit under a name now locked, say), which a waiter of this kind would count
// ahead of it; nothing was written. The error names what was found.
var ErrOtherKind = errors.New("etcdsync: the name is used by another kind of primitive")

// A Claim is a use of the name whose keys lie under Prefix.
type Claim struct {
	Prefix string
	Use    Use
}

// Guard are the compares that hold while no key lies under the name outside what the
// claim's use owns; none for a claim without a use.
func (c Claim) Guard() []clientv3.Cmp {
	if c.Use == 0 {
		return nil
	}
	f := c.Use.foreign()
	cmps := make([]clientv3.Cmp, len(f))
	for i, s := range f {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(c.Prefix+s.from), "=", 0).WithRange(s.end(c.Prefix))
	}
	return cmps
}

// probes read, keys only, the first key of each sub-range the claim's use does not own.
func (c Claim) probes() []clientv3.Op {
	var ops []clientv3.Op
	for _, s := range c.Use.foreign() {
		ops = append(ops, clientv3.OpGet(c.Prefix+s.from, clientv3.WithRange(s.end(c.Prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(1)))
	}
	return ops
}

// Check reads the name's sub-ranges that the claims' uses do not own, and returns
// ErrOtherKind naming the first key found there; nil if there is none, or the read failed
// (the caller's own error then stands). For a write whose guard failed: was it this? One
// Range per sub-range, in one Txn.
func Check(ctx context.Context, cli *clientv3.Client, claims ...Claim) error {
	var ops []clientv3.Op
	for _, c := range claims {
		ops = append(ops, c.probes()...)
	}
	if len(ops) == 0 {
		return nil
	}
	resp, err := Retry(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return cli.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
	})
	if err != nil {
		return nil
	}
	i := 0
	for _, c := range claims {
		for range c.Use.foreign() {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
				return c.otherKind(string(kvs[0].Key))
			}
			i++
		}
	}
	return nil
}

// foreign reports whether key, under the claim's name, is not of the claim's use.
func (c Claim) foreign(key string) bool {
	rest := strings.TrimPrefix(key, c.Prefix)
	for _, s := range ownedBy[c.Use] {
		if rest >= s.from && (s.to == "" || rest < s.to) {
			return false
		}
	}
	return true
}

// otherKind is ErrOtherKind for key, found under the claim's name.
func (c Claim) otherKind(key string) error {
	what := "a key of no primitive's"
	if u := UseOf(strings.TrimPrefix(key, c.Prefix)); u != 0 {
		what = "a key of a " + u.String()
	}
	return fmt.Errorf("%w: %s holds %s, %s, not of a %s: use another name, or once nobody uses it "+
		"remove its lasting records with `etcdsync delete` (admin.Delete)", ErrOtherKind,
		strings.TrimSuffix(c.Prefix, "/"), what, key, c.Use)
}

// The modes of a key whose hold changed in place.
const (
	// ModeRead: a write key whose hold is now a read hold (rwmutex Downgrade).
	ModeRead = "read"
	// ModeUpgradable: a write key of an upgradable read: beside readers, never beside a
	// writer or another upgradable read (rwmutex ULock).
	ModeUpgradable = "upgradable"
	// ModeUpgrading: an upgradable read on its way to the write hold (Upgrade). A waiter
	// that passes upgradable reads passes it only if its key was created before the
	// change, that is before the key's mod revision; one created after waits for it.
	ModeUpgrading = "upgrading"
)

// modeField starts the mode's field in a value.
const modeField = " mode="

// ModeOf is the mode a key's value says: its last field's, if that is " mode=<m>"; else "".
func ModeOf(value string) string {
	i := strings.LastIndex(value, modeField)
	if i < 0 {
		if strings.HasPrefix(value, modeField[1:]) {
			return value[len(modeField)-1:]
		}
		return ""
	}
	m := value[i+len(modeField):]
	if strings.ContainsAny(m, " \t\n") {
		return ""
	}
	return m
}

// WithMode is value with mode as its last field ("" writes none: the kind's own).
func WithMode(value, mode string) string {
	if mode == "" {
		return value
	}
	return value + modeField + mode
}

// markedLimit is the limit a marker's key names, relative to the mark's range (the name's
// prefix and LimitMark); false if it names none.
func markedLimit(rest string) (int, bool) {
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 1 && n <= MaxUnits && strconv.Itoa(n) == rest
}

// markedIn is the capacity the markers under mark among kvs say (the least, should an
// operator have left more than one); false without a mark or a marker.
func markedIn(kvs []*mvccpb.KeyValue, mark string) (int, bool) {
	least := 0
	for _, kv := range kvs {
		rest, ok := strings.CutPrefix(string(kv.Key), mark)
		if n, marked := markedLimit(rest); mark != "" && ok && marked && (least == 0 || n < least) {
			least = n
		}
	}
	return least, least > 0
}

// IsRecord reports whether rest, a key relative to its name's prefix, is a record of the
// name (a semaphore's limit or its marker), not a holder's or waiter's key.
func IsRecord(rest string) bool {
	return rest == RecordLimit || strings.HasPrefix(rest, LimitMark)
}
