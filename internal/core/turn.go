package core

import (
	"context"
	"slices"
	"sync"
)

// Turn is the one turn of the calls of a handle that must not overlap (a Lock and the next,
// two Unlocks, two Campaigns). The zero Turn is free. It is handed over in order: Give
// passes it straight to the caller that has waited longest, so a caller that gives it back
// and asks again at once (a Run's next term) queues behind those already waiting, as a
// goroutine blocked on a full channel of one does. It costs a few words until someone
// waits for it: a process may keep a handle per name for thousands of names.
type Turn struct {
	mu      sync.Mutex
	taken   bool
	waiters []chan struct{} // oldest first; closed when handed the turn
}

// Take takes the turn: at once if it is free, also with ctx done, so that a done ctx still
// gets what needs no I/O; otherwise once it is handed over, or ctx's error.
func (t *Turn) Take(ctx context.Context) error {
	_, err := t.TakeOr(ctx, nil, nil)
	return err
}

// TakeOr is Take that also stops waiting when a or b closes (nil: never), for a caller that
// waits for the turn and for something else at once: taken reports whether it has the turn
// (handed over as a or b closed, it has).
func (t *Turn) TakeOr(ctx context.Context, a, b <-chan struct{}) (taken bool, err error) {
	t.mu.Lock()
	if !t.taken {
		t.taken = true
		t.mu.Unlock()
		return true, nil
	}
	w := make(chan struct{})
	t.waiters = append(t.waiters, w)
	t.mu.Unlock()
	select {
	case <-w:
		return true, nil
	case <-a:
	case <-b:
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-w: // handed over meanwhile
		if err == nil {
			return true, nil
		}
		t.giveLocked() // ctx ended: on to the next
		return false, err
	default:
	}
	t.waiters = slices.DeleteFunc(t.waiters, func(x chan struct{}) bool { return x == w })
	return false, err
}

// TryTake takes the turn if it is free, and reports whether it did.
func (t *Turn) TryTake() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.taken {
		return false
	}
	t.taken = true
	return true
}

// Give gives the turn back: to the caller that has waited longest, or free.
func (t *Turn) Give() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.giveLocked()
}

func (t *Turn) giveLocked() {
	if len(t.waiters) == 0 {
		t.taken, t.waiters = false, nil
		return
	}
	close(t.waiters[0])
	t.waiters = t.waiters[1:]
}
