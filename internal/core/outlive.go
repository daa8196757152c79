package core

import "context"

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
