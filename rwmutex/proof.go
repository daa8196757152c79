package rwmutex

import (
	"context"
	"slices"

	"github.com/etcdsync/etcdsync/internal/core"
)

// A check is one read of a group's key that proves, for every reader who left before it
// started, that the key was there all along.
type check struct {
	done  chan struct{}
	alive bool
	err   error
}

// checkLater returns the next check of g's key that starts from now on, starting the
// checks if none runs. Under rw.mu.
func (rw *RWMutex) checkLater(g *group) *check {
	if g.next == nil {
		g.next = &check{done: make(chan struct{})}
	}
	c := g.next
	if !g.checking {
		g.checking = true
		go rw.runChecks(g)
	}
	return c
}

// runChecks reads g's key once for each batch of readers leaving, until none waits.
func (rw *RWMutex) runChecks(g *group) {
	for {
		rw.mu.Lock()
		c := g.next
		g.next = nil
		if c == nil {
			g.checking = false
			rw.mu.Unlock()
			return
		}
		rw.mu.Unlock()
		ctx, cancel := core.Detached(context.Background())
		c.alive, c.err = g.hold.Check(ctx)
		cancel()
		close(c.done)
	}
}

// leave waits for c, the check that proves a leaving reader (taken, if an RDo's) held until it left: the
// group's key existed from its creation until after the reader's RUnlock was called. When
// that cannot be known before ctx ends, the reader still holds and may RUnlock again. A
// key found gone is a loss for every reader still in the handle (see RWMutex).
func (rw *RWMutex) leave(ctx context.Context, g *group, c *check, taken *scopedReader) error {
	select {
	case <-c.done:
		switch {
		case c.err != nil:
		case c.alive:
			return nil
		default:
			// Gone: lost, or deleted by the last reader's release, which then proves as
			// much as the check would have. The hold ends either way.
			select {
			case <-g.hold.Done():
				return rw.left(g.hold.Err())
			case <-ctx.Done():
			}
		}
	case <-ctx.Done():
	}
	rw.mu.Lock()
	if ch := g.releasing; ch != nil {
		// The last reader is releasing the group: its outcome settles this reader's too.
		rw.mu.Unlock()
		<-ch
		rw.mu.Lock()
	}
	if !slices.Contains(rw.groups, g) {
		// Released by the last reader: its fenced delete proves the key was there.
		rw.mu.Unlock()
		return rw.left(g.hold.Err())
	}
	g.rejoin(taken)
	rw.mu.Unlock()
	err := ctx.Err()
	select {
	case <-c.done:
		if c.err != nil {
			err = c.err
		}
	default:
	}
	return rw.errorf("runlock", err)
}

// left is the outcome of a reader who left a group whose hold ended with err.
func (rw *RWMutex) left(err error) error {
	if err == nil {
		return nil
	}
	rw.mu.Lock()
	rw.noteReadLoss(err)
	rw.endReadLoss()
	rw.mu.Unlock()
	return rw.errorf("runlock", err)
}
