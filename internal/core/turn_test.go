package core

import (
	"context"
	"testing"
	"time"
)

// TestTurnIsHandedOverInOrder: a Turn given back goes to the caller that has waited
// longest, not to one that asks again at once (as a Run's next term would), and a waiter
// that stops waiting (its ctx, or another event) leaves the line.
func TestTurnIsHandedOverInOrder(t *testing.T) {
	var turn Turn
	if !turn.TryTake() {
		t.Fatal("a zero Turn is free")
	}
	got := make(chan int, 3)
	queued := func(n int) {
		for {
			turn.mu.Lock()
			l := 0
			if turn.waiters != nil {
				l = len(*turn.waiters)
			}
			turn.mu.Unlock()
			if l == n {
				return
			}
			time.Sleep(time.Millisecond) // a test of the type itself: no event tells a queued waiter
		}
	}
	for i := range 2 {
		go func() {
			if err := turn.Take(context.Background()); err == nil {
				got <- i
			}
		}()
		queued(i + 1)
	}
	stop := make(chan struct{})
	stopped := make(chan bool, 1)
	go func() {
		taken, _ := turn.TakeOr(context.Background(), stop, nil)
		stopped <- taken
	}()
	queued(3)
	close(stop)
	if <-stopped {
		t.Fatal("a waiter that stopped was handed the turn")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := turn.Take(ctx); err == nil {
		t.Fatal("Take with a done ctx got a taken turn")
	}
	turn.Give()
	if turn.TryTake() {
		t.Fatal("TryTake took a turn handed to a waiter")
	}
	if first := <-got; first != 0 {
		t.Fatalf("the turn went to waiter %d first", first)
	}
	turn.Give()
	if second := <-got; second != 1 {
		t.Fatalf("the turn went to waiter %d second", second)
	}
	turn.Give()
	if !turn.TryTake() {
		t.Fatal("the turn is free once nobody waits")
	}
}
