package faulttest

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// OpKind says what an operation of the history did.
type OpKind int

const (
	Acquire     OpKind = iota // Lock returned a hold with Token
	Write                     // a fenced read-modify-write of the register under the hold Token
	Release                   // Unlock of the hold Token
	ReadAcquire               // RLock returned a read hold; it has no token of its own
	ReadRelease               // RUnlock of the worker's read hold: the last ReadAcquire of the worker
)

// Outcome is how an operation ended. An acquire is recorded only when Lock (RLock)
// succeeded.
type Outcome int

const (
	OK        Outcome = iota // acquired, write accepted, released
	Refused                  // write: the fence failed; release, read release: the hold was lost (ErrLost)
	Ambiguous                // the RPC failed without an answer: it may or may not have happened
)

func (k OpKind) String() string {
	return [...]string{"acquire", "write", "release", "read-acquire", "read-release"}[k]
}

// reads says whether k is an operation of a reader worker.
func (k OpKind) reads() bool { return k == ReadAcquire || k == ReadRelease }

func (o Outcome) String() string { return [...]string{"ok", "refused", "ambiguous"}[o] }

// Op is one recorded operation. Call and Return come from the history's one monotonic clock.
type Op struct {
	Worker       int
	Kind         OpKind
	Token        int64
	Units        int   // Acquire: how many of the slots the hold takes (0 counts as 1)
	WriteID      int64 // Write: unique, also the name of its marker key
	Read         int64 // Write: the register's value read before the fenced Txn
	Outcome      Outcome
	Call, Return time.Duration
	Err          error // why it was refused or ambiguous, for messages
}

func (op Op) String() string {
	s := fmt.Sprintf("[%v, %v] worker %d %s", op.Call, op.Return, op.Worker, op.Kind)
	if !op.Kind.reads() {
		s += fmt.Sprintf(" token %d", op.Token)
	}
	if op.Units > 1 {
		s += fmt.Sprintf(" units %d", op.Units)
	}
	if op.Kind == Write {
		s += fmt.Sprintf(" write %d read %d", op.WriteID, op.Read)
	}
	if op.Kind != Acquire && op.Kind != ReadAcquire {
		s += " -> " + op.Outcome.String()
	}
	if op.Err != nil {
		s += fmt.Sprintf(" (%v)", op.Err)
	}
	return s
}

// History records the operations of a run, safe for concurrent use.
type History struct {
	start time.Time

	mu         sync.Mutex
	ops        []Op
	failedLock []Op          // Lock and RLock calls that returned an error: not operations of the model
	changed    chan struct{} // closed and replaced by every add
}

func newHistory() *History {
	return &History{start: time.Now(), changed: make(chan struct{})}
}

// Now is the time since the history started, on the monotonic clock.
func (h *History) Now() time.Duration { return time.Since(h.start) }

func (h *History) add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
	close(h.changed)
	h.changed = make(chan struct{})
}

// lockFailed records a Lock (kind Acquire) or RLock (ReadAcquire) call that returned err,
// for diagnosis only.
func (h *History) lockFailed(worker int, kind OpKind, call time.Duration, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failedLock = append(h.failedLock, Op{Worker: worker, Kind: kind, Call: call, Return: h.Now(), Outcome: Refused, Err: err})
}

// FailedLocks returns the Lock and RLock calls that returned an error, as acquires and read
// acquires with their error.
func (h *History) FailedLocks() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.failedLock...)
}

// Ops returns a copy of the operations recorded so far, in the order they returned.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Await returns the first operation for which match holds, waiting for new ones until ctx
// ends.
func (h *History) Await(ctx context.Context, match func(Op) bool) (Op, error) {
	seen := 0
	for {
		h.mu.Lock()
		ops, changed := h.ops[seen:], h.changed
		seen = len(h.ops)
		h.mu.Unlock()
		for _, op := range ops {
			if match(op) {
				return op, nil
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return Op{}, ctx.Err()
		}
	}
}

// awaitAcquires waits until n acquires returned after since, by any worker but not, and
// returns the time the last of them returned.
func (h *History) awaitAcquires(ctx context.Context, n int, since time.Duration, not int) (time.Duration, error) {
	return h.awaitKind(ctx, Acquire, n, since, not)
}

// awaitKind is awaitAcquires for operations of any kind.
func (h *History) awaitKind(ctx context.Context, kind OpKind, n int, since time.Duration, not int) (time.Duration, error) {
	count := 0
	op, err := h.Await(ctx, func(op Op) bool {
		if op.Kind == kind && op.Return > since && op.Worker != not {
			count++
		}
		return count == n
	})
	if err != nil {
		return 0, fmt.Errorf("%d of %d %ss after %v: %w", count, n, kind, since, err)
	}
	return op.Return, nil
}
