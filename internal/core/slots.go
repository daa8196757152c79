package core

import (
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// An acquisition's key is "<stem>_<slot>", where the stem is the name prefix, the kind and
// the lease in hex, and the slot is the lowest number no other live acquisition of this
// process holds under the same stem. Keys are thus unique among live acquisitions (a lease
// belongs to one process) and are reused from one acquisition to the next.
//
// Reuse matters for speed: etcd keeps a deleted key in its index until the next compaction,
// and every range over the name walks those tombstones. With a fresh key per acquisition
// (a random suffix), a busy lock slows down with every cycle until a compaction; with reused
// keys the index holds one entry per slot.
var (
	slotsMu    sync.Mutex
	slotsInUse = map[string][]bool{} // by stem; an entry goes when its last slot is freed
)

// slot is one live acquisition's claim on a key.
type slot struct {
	stem string
	n    int
	once sync.Once
}

func claimSlot(prefix, kind string, lease clientv3.LeaseID) *slot {
	stem := fmt.Sprintf("%s%s%x", prefix, kind, int64(lease))
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
	return &slot{stem: stem, n: n}
}

func (s *slot) key() string { return fmt.Sprintf("%s_%d", s.stem, s.n) }

// free gives the slot back; only the first call counts. The key may still exist in etcd
// (a cleanup that could not reach it): the next claimant of the slot then finds it there.
func (s *slot) free() {
	s.once.Do(func() {
		slotsMu.Lock()
		defer slotsMu.Unlock()
		used := slotsInUse[s.stem]
		used[s.n] = false
		for len(used) > 0 && !used[len(used)-1] {
			used = used[:len(used)-1]
		}
		if len(used) == 0 {
			delete(slotsInUse, s.stem)
			return
		}
		slotsInUse[s.stem] = used
	})
}
