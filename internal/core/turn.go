package core

import (
	"context"
	"sync"
)

// Turn is the one turn of the calls of a handle that must not overlap (a Lock and the next,
// two Unlocks). The zero Turn is free. It costs two words until someone waits for it: a
// process may keep a handle per name for thousands of names.
type Turn struct {
	mu    sync.Mutex
	taken bool
	freed chan struct{} // made by the first caller that waits; closed by Give
}

// Take takes the turn: at once if it is free, also with ctx done, so that a done ctx still
// gets what needs no I/O; otherwise once it is given back, or ctx's error.
func (t *Turn) Take(ctx context.Context) error {
	for {
		t.mu.Lock()
		if !t.taken {
			t.taken = true
			t.mu.Unlock()
			return nil
		}
		if t.freed == nil {
			t.freed = make(chan struct{})
		}
		freed := t.freed
		t.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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

// Give gives the turn back, to whoever waits for it.
func (t *Turn) Give() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.taken = false
	if t.freed != nil {
		close(t.freed)
		t.freed = nil
	}
}

// Freed is closed once the turn is free: at once if it is, else when it is given back. For a
// caller that waits for the turn and for something else at once, then takes it (TryTake).
func (t *Turn) Freed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.taken {
		return Closed
	}
	if t.freed == nil {
		t.freed = make(chan struct{})
	}
	return t.freed
}
