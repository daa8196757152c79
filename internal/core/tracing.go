package core

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// defaultTracerProvider is otel's global TracerProvider before anyone set one: it delegates
// to the one set later, and records nothing until then.
var defaultTracerProvider = otel.GetTracerProvider()

// tracing reports whether a span started on ctx may record: ctx carries a recording span,
// or a TracerProvider other than the default and the no-op one is set globally. Otherwise
// starting one would only cost a context and a span, for nothing.
func tracing(ctx context.Context) bool {
	if trace.SpanFromContext(ctx).IsRecording() {
		return true
	}
	tp := otel.GetTracerProvider()
	if tp == defaultTracerProvider {
		return false
	}
	_, noop := tp.(tracenoop.TracerProvider)
	return !noop
}

// startSpan starts a span named name with attrs, from the global TracerProvider, unless it
// could not record (see tracing): it then returns ctx and a nil span.
func startSpan(ctx context.Context, name string, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	if !tracing(ctx) {
		return ctx, nil
	}
	return otel.Tracer(Scope).Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends span with the outcome, the hold's token if there is one, and err's text as
// an error status for an outcome of error.
func endSpan(span trace.Span, outcome attribute.KeyValue, failed bool, err error, token int64) {
	span.SetAttributes(outcome)
	if token > 0 {
		span.SetAttributes(attrToken.Int64(token))
	}
	if failed {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
