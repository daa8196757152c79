package core

import (
	"strconv"
	"sync"
)

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
	return &slot{k: k, stem: len(stem), n: n, sess: sess}
}

// key is the slot's key.
func (s *slot) key() string { return s.k }

// free gives the slot back once its key is known to be gone; only the first call counts.
func (s *slot) free() {
	s.once.Do(func() {
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
