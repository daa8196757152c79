// Package metrictest reads what the primitives record, for tests: a MeterProvider of the
// OpenTelemetry SDK with a manual reader, and a global TracerProvider with an in-memory span
// recorder. Only tests and examples import it; the library records through the API alone.
package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys and the instruments' names, as API.md lists them.
const (
	Primitive = attribute.Key("etcdsync.primitive")
	Outcome   = attribute.Key("etcdsync.outcome")
	Cause     = attribute.Key("etcdsync.cause")
	Name      = attribute.Key("etcdsync.name")

	AcquireDuration = "etcdsync.acquire.duration"
	HoldDuration    = "etcdsync.hold.duration"
	HoldLost        = "etcdsync.hold.lost"
	Holds           = "etcdsync.holds"
	Waiters         = "etcdsync.waiters"
	LeaseRenewals   = "etcdsync.lease.renewals"
	QueueAhead      = "etcdsync.queue.ahead"
	LeaderStepdowns = "etcdsync.leader.stepdowns"
	HoldOldest      = "etcdsync.hold.oldest"
)

// Reader is a MeterProvider whose measurements a test collects when it likes.
type Reader struct {
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewReader returns a Reader, shut down in tb.Cleanup.
func NewReader(tb testing.TB) *Reader {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	tb.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Reader{Provider: mp, reader: r}
}

// Collect returns what has been recorded so far.
func (r *Reader) Collect(tb testing.TB) Data {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		tb.Fatal(err)
	}
	return Data{rm}
}

// Data is one collection.
type Data struct{ rm metricdata.ResourceMetrics }

// Count is the number of measurements of the histogram name whose attributes include
// every one of attrs.
func (d Data) Count(name string, attrs ...attribute.KeyValue) uint64 {
	n, _ := histogram[float64](d, name, attrs)
	return n
}

// Histogram is the number and the sum of the measurements of the integer histogram name
// whose attributes include every one of attrs.
func (d Data) Histogram(name string, attrs ...attribute.KeyValue) (count uint64, sum int64) {
	return histogram[int64](d, name, attrs)
}

func histogram[N int64 | float64](d Data, name string, attrs []attribute.KeyValue) (count uint64, sum N) {
	for _, m := range d.metrics(name) {
		if h, ok := m.Data.(metricdata.Histogram[N]); ok {
			for _, p := range h.DataPoints {
				if has(p.Attributes, attrs) {
					count += p.Count
					sum += p.Sum
				}
			}
		}
	}
	return count, sum
}

// Sum is the value of the counter or up-down counter name, over the points whose
// attributes include every one of attrs.
func (d Data) Sum(name string, attrs ...attribute.KeyValue) int64 {
	var n int64
	for _, m := range d.metrics(name) {
		if s, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range s.DataPoints {
				if has(p.Attributes, attrs) {
					n += p.Value
				}
			}
		}
	}
	return n
}

// Gauge is the values of the float gauge name, by the value of key in each point's
// attributes ("" for a point without it).
func (d Data) Gauge(name string, key attribute.Key) map[string]float64 {
	vals := make(map[string]float64)
	for _, m := range d.metrics(name) {
		if g, ok := m.Data.(metricdata.Gauge[float64]); ok {
			for _, p := range g.DataPoints {
				name := "" // a point without key: an empty Value's Emit differs between versions
				if v, ok := p.Attributes.Value(key); ok {
					name = v.Emit()
				}
				vals[name] = p.Value
			}
		}
	}
	return vals
}

// Attributes are the attribute sets of every point of name.
func (d Data) Attributes(name string) []attribute.Set {
	var sets []attribute.Set
	for _, m := range d.metrics(name) {
		switch data := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, p := range data.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Sum[int64]:
			for _, p := range data.DataPoints {
				sets = append(sets, p.Attributes)
			}
		}
	}
	return sets
}

// Unit is the unit name was made with, "" if it was not recorded.
func (d Data) Unit(name string) string {
	for _, m := range d.metrics(name) {
		return m.Unit
	}
	return ""
}

func (d Data) metrics(name string) []metricdata.Metrics {
	var ms []metricdata.Metrics
	for _, sm := range d.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				ms = append(ms, m)
			}
		}
	}
	return ms
}

func has(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, kv := range attrs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// Spans sets a global TracerProvider that records every span in memory, until tb's end,
// when the one before is set again.
func Spans(tb testing.TB) *tracetest.SpanRecorder {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	tb.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	return sr
}

// Parent returns ctx with a recording span of the test's own, and the span.
func Parent(ctx context.Context, name string) (context.Context, trace.Span) {
	return otel.Tracer("metrictest").Start(ctx, name)
}

// Outcomes lists the outcome attribute of every ended span named name, in order of ending.
func Outcomes(sr *tracetest.SpanRecorder, name string) []string {
	var out []string
	for _, s := range sr.Ended() {
		if s.Name() != name {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == Outcome {
				out = append(out, kv.Value.AsString())
			}
		}
	}
	return out
}
