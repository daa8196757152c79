package core

import (
	"context"
	"sync"
	"time"
)

// The contexts of this file outlive the context of the call that made them: for work that
// must finish, or be answered, after its caller gave up (a Txn that may have written a key,
// a release in flight, a cleanup).

// Outlive returns a context with ctx's values that ends grace after ctx does (grace from now
// if ctx is done already), or when the returned cancel is called: a deadline that passes
// while a request is in flight leaves it grace to be answered.
func Outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		timer = time.AfterFunc(grace, cancel)
		mu.Unlock()
	})
	return octx, func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// detached returns a context with ctx's values that ignores ctx's end and ends after d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// Detached is a context that outlives ctx's cancellation by at most 5 s, for the public
// packages' own cleanups.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return detached(ctx, tryTimeout)
}

// tryContext is the context of one try of a Txn that may write a key: it outlives ctx, so
// that a try cancelled in flight is still answered (etcd may apply it after the client gave
// up), by answerGrace, and is bounded by tryTimeout in any case.
func tryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	octx, cancel := Outlive(ctx, answerGrace)
	tctx, cancelTry := context.WithTimeout(octx, tryTimeout)
	return tctx, func() { cancelTry(); cancel() }
}

// outlivingKey is the context key of WithOutliving.
type outlivingKey struct{}

// WithOutliving marks ctx, the context of a call made on behalf of parent that is cut short
// before parent ends (a try of trylock.Timeout, whose context ends when Timeout returns), so
// that what the call hands back to outlive it, such as a reentrant owning context, derives
// from parent instead of ctx. ctx must derive from parent; marks nest to the outermost.
func WithOutliving(ctx, parent context.Context) context.Context {
	return context.WithValue(ctx, outlivingKey{}, Outliving(parent))
}

// Outliving is the context in ctx to derive what outlives a call from: the parent that
// WithOutliving marked, else ctx itself.
func Outliving(ctx context.Context) context.Context {
	if p, ok := ctx.Value(outlivingKey{}).(context.Context); ok {
		return p
	}
	return ctx
}
