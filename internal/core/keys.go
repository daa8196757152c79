package core

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// MaxNameLen is the longest name, in bytes.
const MaxNameLen = 512

// The sub-ranges and records under a name's prefix, every one the primitives use. An
// exclusive lock's (mutex, reentrant, election) keys lie directly under the name's prefix.
const (
	KindRead    = "read/"   // rwmutex readers
	KindWrite   = "write/"  // rwmutex writers
	KindPermit  = "permit/" // semaphore permits
	RecordLimit = "limit"   // the semaphore's limit record
)

// KeyShape is what a holder's or waiter's key says by its shape alone (ParseKey).
type KeyShape struct {
	Kind   string // KindRead, KindWrite, KindPermit, KindParticipant, or "" for a key directly under the name (a lock's, a candidate's)
	Units  int    // what it weighs: a permit's n under "u<n>/", else 1
	Recipe bool   // etcd's recipe.RWMutex wrote it: a read or write key without a slot
}

// ParseKey reads rest, a key relative to its name's prefix, as a holder's or waiter's key:
// its kind, then for a permit of n > 1 units "u<n>/", then a lease in hex with "_" and a
// slot in decimal (etcdsync), or without them (etcd's Mutex and Election, etcdctl; under
// read/ and write/, etcd's recipe.RWMutex, whose time in decimal reads as hex too). False
// for anything else: a record, a marker, data that is not a primitive's.
func ParseKey(rest string) (KeyShape, bool) {
	shape := KeyShape{Units: 1}
	for _, kind := range []string{KindRead, KindWrite, KindPermit, KindParticipant} {
		if r, ok := strings.CutPrefix(rest, kind); ok {
			shape.Kind, rest = kind, r
			break
		}
	}
	if shape.Kind == KindPermit {
		if units, r, ok := strings.Cut(rest, "/"); ok {
			n, found := strings.CutPrefix(units, unitsMark)
			v, err := strconv.Atoi(n)
			if !found || err != nil || v < 2 || v > MaxUnits || strconv.Itoa(v) != n {
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
