package core

import (
	"fmt"
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
	stem string
	n    int
	sess *Session
	once sync.Once
}

func claimSlot(prefix, kind string, sess *Session) *slot {
	stem := fmt.Sprintf("%s%s%x", prefix, kind, int64(sess.Lease()))
	sess.claim()
	slotsMu.Lock()
	defer slotsMu.Unlock()
	used := slotsInUse[stem]
	n := 0
	for n < len(used) && used[n] {
		n++
	}
	if n == len(used) {
		used = append(used, true)
	} else {
		used[n] = true
	}
	slotsInUse[stem] = used
	return &slot{stem: stem, n: n, sess: sess}
}

func (s *slot) key() string { return fmt.Sprintf("%s_%d", s.stem, s.n) }

// free gives the slot back once its key is known to be gone; only the first call counts.
func (s *slot) free() {
	s.once.Do(func() {
		slotsMu.Lock()
		used := slotsInUse[s.stem]
		used[s.n] = false
		for len(used) > 0 && !used[len(used)-1] {
			used = used[:len(used)-1]
		}
		if len(used) == 0 {
			delete(slotsInUse, s.stem)
		} else {
			slotsInUse[s.stem] = used
		}
		slotsMu.Unlock()
		s.sess.unclaim()
	})
}
