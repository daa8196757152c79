package core

import "context"

// TakeTurn takes the one turn of a channel of capacity 1 (send to take, receive to give it
// back), for a call that must not overlap another of its kind on one handle: at once if it
// is free, also with ctx done, so that a done ctx still gets what needs no I/O; otherwise
// once the other call gives it back, or ctx's error.
func TakeTurn(ctx context.Context, turn chan struct{}) error {
	select {
	case turn <- struct{}{}:
		return nil
	default:
	}
	select {
	case turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
