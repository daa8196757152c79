package core

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope of every meter and tracer of the module.
const Scope = "github.com/etcdsync/etcdsync"

// Primitive is the value of the etcdsync.primitive attribute.
type Primitive string

// The primitives, as API.md names them.
const (
	PrimitiveMutex     Primitive = "mutex"
	PrimitiveRead      Primitive = "rwmutex.read"
	PrimitiveWrite     Primitive = "rwmutex.write"
	PrimitiveReentrant Primitive = "reentrant"
	PrimitiveSemaphore Primitive = "semaphore"
	PrimitiveElection  Primitive = "election"
	PrimitiveMulti     Primitive = "mutex.multi" // a hold of several names (mutex.Multi)
)

// The attribute keys.
const (
	AttrPrimitive = attribute.Key("etcdsync.primitive")
	AttrOutcome   = attribute.Key("etcdsync.outcome")
	AttrCause     = attribute.Key("etcdsync.cause")
	AttrName      = attribute.Key("etcdsync.name")
	attrToken     = attribute.Key("etcdsync.token")
	attrAhead     = attribute.Key("etcdsync.ahead")
)

// outcome is the value of etcdsync.outcome: how an acquisition, a hold or a release ended.
type outcome int

const (
	acquired outcome = iota // acquisitions
	busy
	canceled
	failed
	released // holds and releases
	lostHold
	outcomes
)

var outcomeNames = [outcomes]string{"acquired", "busy", "canceled", "error", "released", "lost"}

// cause is the value of etcdsync.cause: why a hold was lost.
type cause int

const (
	causeDeadline cause = iota // the lease's local deadline passed with no renewal through
	causeDeleted               // the key was deleted while the lease lived
	causeRevoked               // etcd says the lease is gone, or the caller's session ended
	causeShutdown              // Shutdown revoked the lease, or the client was closed
	causeReleased              // an operator released it (ErrReleasedByOperator)
	causeMaxHold               // its maximum hold passed (ErrMaxHold)
	causes
)

var causeNames = [causes]string{"deadline", "deleted", "revoked", "shutdown", "released", "maxhold"}

// Bucket boundaries for waits and holds, in seconds: a local hand-off takes milliseconds, a
// hold or a contended wait may take minutes.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// instruments are the module's instruments from one MeterProvider.
type instruments struct {
	acquire  metric.Float64Histogram
	hold     metric.Float64Histogram
	lost     metric.Int64Counter
	holds    metric.Int64UpDownCounter
	waiters  metric.Int64UpDownCounter
	renewals metric.Int64Counter
	ahead    metric.Int64Histogram
	// stepdowns counts the terms of election.Run that ended, by why.
	stepdowns metric.Int64Counter
	// The options of a renewal, made once: a variadic option built per call allocates.
	renewOK, renewFailed []metric.AddOption
	// live are the holds counted and not ended, whose ages etcdsync.hold.oldest reports.
	live liveHolds
}

// instrumentsByProvider are the instruments made from each MeterProvider, so that the
// callback of etcdsync.hold.oldest is registered once per provider, not once per handle.
var (
	instrumentsMu         sync.Mutex
	instrumentsByProvider = map[metric.MeterProvider]*instruments{}
)

// instrumentsFor returns the instruments of mp (of the global MeterProvider when mp is
// nil), made at its first use. A provider of a type that cannot be a map key gets
// instruments of its own at each call.
func instrumentsFor(mp metric.MeterProvider) *instruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if !reflect.TypeOf(mp).Comparable() {
		return newInstruments(mp)
	}
	instrumentsMu.Lock()
	defer instrumentsMu.Unlock()
	in := instrumentsByProvider[mp]
	if in == nil {
		in = newInstruments(mp)
		instrumentsByProvider[mp] = in
	}
	return in
}

// newInstruments makes the instruments from mp: the global MeterProvider delegates to a
// provider set later, so a handle made before otel.SetMeterProvider records through it. An
// instrument that cannot be made is a no-op one; the error goes to otel's error handler.
func newInstruments(mp metric.MeterProvider) *instruments {
	m := mp.Meter(Scope)
	noop := metricnoop.Meter{}
	var errs []error
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		if err != nil {
			errs = append(errs, err)
			h, _ = noop.Float64Histogram(name)
		}
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			c, _ = noop.Int64Counter(name)
		}
		return c
	}
	upDown := func(name, unit, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			c, _ = noop.Int64UpDownCounter(name)
		}
		return c
	}
	in := &instruments{
		acquire:     histogram("etcdsync.acquire.duration", "Time from the call to acquire until it returned, by outcome."),
		hold:        histogram("etcdsync.hold.duration", "Time from the grant of a hold until it ended, by outcome."),
		lost:        counter("etcdsync.hold.lost", "{hold}", "Holds that ended without a release, by cause."),
		holds:       upDown("etcdsync.holds", "{hold}", "Holds granted and not ended."),
		waiters:     upDown("etcdsync.waiters", "{waiter}", "Blocking acquisitions under way."),
		renewals:    counter("etcdsync.lease.renewals", "{renewal}", "Renewals of the shared leases, by outcome."),
		ahead:       aheadHistogram(m, noop, &errs),
		stepdowns:   counter("etcdsync.leader.stepdowns", "{term}", "Terms of election.Run that ended, by cause."),
		renewOK:     []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrOutcome.String("ok")))},
		renewFailed: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrOutcome.String("failed")))},
	}
	in.live.holds = map[*holdMetrics]struct{}{}
	if _, err := m.Float64ObservableGauge("etcdsync.hold.oldest", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest hold granted and not ended, by primitive (and name)."),
		metric.WithFloat64Callback(in.live.observe)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		otel.Handle(fmt.Errorf("etcdsync: instruments: %w", err))
	}
	return in
}

// liveHolds are the holds of one provider's instruments granted and not ended.
type liveHolds struct {
	mu    sync.Mutex
	holds map[*holdMetrics]struct{}
}

func (l *liveHolds) add(m *holdMetrics) {
	l.mu.Lock()
	l.holds[m] = struct{}{}
	l.mu.Unlock()
}

func (l *liveHolds) remove(m *holdMetrics) {
	l.mu.Lock()
	delete(l.holds, m)
	l.mu.Unlock()
}

// observe reports, for each attribute set with a live hold, the age of its oldest.
func (l *liveHolds) observe(_ context.Context, o metric.Float64Observer) error {
	type oldest struct {
		set     attribute.Set
		granted time.Time
	}
	l.mu.Lock()
	by := make(map[attribute.Distinct]oldest)
	for m := range l.holds {
		k := m.t.set.Equivalent()
		if old, ok := by[k]; !ok || m.granted.Before(old.granted) {
			by[k] = oldest{m.t.set, m.granted}
		}
	}
	l.mu.Unlock()
	now := time.Now()
	for _, old := range by {
		o.Observe(now.Sub(old.granted).Seconds(), metric.WithAttributeSet(old.set))
	}
	return nil
}

// aheadBuckets are the bucket boundaries of etcdsync.queue.ahead: 0 is served at once.
var aheadBuckets = []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

func aheadHistogram(m, noop metric.Meter, errs *[]error) metric.Int64Histogram {
	const name = "etcdsync.queue.ahead"
	h, err := m.Int64Histogram(name, metric.WithUnit("{key}"),
		metric.WithDescription("Keys ahead of a blocking acquisition when it joined the line (units, on a semaphore); 0 when served at once."),
		metric.WithExplicitBucketBoundaries(aheadBuckets...))
	if err != nil {
		*errs = append(*errs, err)
		h, _ = noop.Int64Histogram(name)
	}
	return h
}

// renewal counts one renewal of a shared lease; a nil in counts nothing.
func (in *instruments) renewal(ok bool) {
	if in == nil {
		return
	}
	if ok {
		in.renewals.Add(context.Background(), 1, in.renewOK...)
	} else {
		in.renewals.Add(context.Background(), 1, in.renewFailed...)
	}
}

// WithMeterProvider makes the primitive's instruments come from mp instead of the global
// MeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return option(optMeter, func(c *Config) {
		if mp == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: nil MeterProvider", ErrInvalidOption))
			return
		}
		c.Meter = mp
	})
}

// WithNameAttribute adds the name as the attribute etcdsync.name to every measurement and
// span of the primitive.
func WithNameAttribute() Option {
	return option(optNameAttribute, func(c *Config) { c.NameAttribute = true })
}

// WithoutTelemetry makes the primitive record nothing and start no span (a nil Telemetry),
// as before etcdsync had metrics: the baseline of the tests that measure what telemetry
// costs. Not offered by the public packages.
func WithoutTelemetry() Option {
	return option(optNoTelemetry, func(c *Config) { c.noTelemetry = true })
}

// Telemetry records the metrics and spans of one handle's acquisitions and holds of one
// primitive. Every option slice is made once, in NewTelemetry, so that recording allocates
// nothing of its own; with a provider that records nothing, nothing is measured either.
// A nil *Telemetry records nothing.
type Telemetry struct {
	mp        metric.MeterProvider // the global provider it was made for, when shared
	ins       *instruments
	attrs     []attribute.KeyValue // the primitive, and the name with WithNameAttribute
	set       attribute.Set        // attrs, as a set
	byOutcome [outcomes][]metric.RecordOption
	byCause   [causes][]metric.AddOption
	byStep    [stepDowns][]metric.AddOption
	plain     []metric.AddOption // the primitive (and name) alone
	plainRec  []metric.RecordOption
	outcomeKV [outcomes]attribute.KeyValue
}

// NewTelemetry is the Telemetry of a handle of primitive p on name, configured by c. The
// handles of one primitive on the global MeterProvider without WithNameAttribute record
// alike, and share one: a process with a handle per tenant pays for its option slices once.
func NewTelemetry(c Config, p Primitive, name string) *Telemetry {
	if c.noTelemetry {
		return nil
	}
	if c.Meter != nil || c.NameAttribute {
		return newTelemetry(c, p, name)
	}
	mp := otel.GetMeterProvider()
	globalTelemetryMu.Lock()
	defer globalTelemetryMu.Unlock()
	if t := globalTelemetry[p]; t != nil && t.mp == mp {
		return t
	}
	t := newTelemetry(Config{Meter: mp}, p, name)
	t.mp = mp
	globalTelemetry[p] = t
	return t
}

// globalTelemetry is the Telemetry shared by the handles of each primitive on the global
// MeterProvider (see NewTelemetry); replaced when the global provider is.
var (
	globalTelemetryMu sync.Mutex
	globalTelemetry   = map[Primitive]*Telemetry{}
)

func newTelemetry(c Config, p Primitive, name string) *Telemetry {
	t := &Telemetry{ins: instrumentsFor(c.Meter), attrs: []attribute.KeyValue{AttrPrimitive.String(string(p))}}
	if c.NameAttribute {
		t.attrs = append(t.attrs, AttrName.String(name))
	}
	t.set = attribute.NewSet(t.attrs...)
	t.plain = []metric.AddOption{metric.WithAttributeSet(t.set)}
	t.plainRec = []metric.RecordOption{metric.WithAttributeSet(t.set)}
	for o := range outcomes {
		kv := AttrOutcome.String(outcomeNames[o])
		t.outcomeKV[o] = kv
		t.byOutcome[o] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{kv}, t.attrs...)...))}
	}
	for c := range causes {
		kv := AttrCause.String(causeNames[c])
		t.byCause[c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{kv}, t.attrs...)...))}
	}
	for s := range stepDowns {
		kv := AttrCause.String(stepDownNames[s])
		t.byStep[s] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{kv}, t.attrs...)...))}
	}
	return t
}

// StepDown is why a term of election.Run ended: the value of etcdsync.cause on
// etcdsync.leader.stepdowns.
type StepDown int

// The causes of a step-down.
const (
	StepDownLost        StepDown = iota // the leadership was lost
	StepDownUnhealthy                   // the health check failed
	StepDownReturned                    // lead returned nil: Run campaigns again
	StepDownError                       // lead returned an error: Run stops
	StepDownCanceled                    // Run's ctx ended
	StepDownTransferred                 // the leadership was transferred: Run campaigns again
	stepDowns
)

var stepDownNames = [stepDowns]string{"lost", "unhealthy", "returned", "error", "canceled", "transferred"}

// SteppedDown counts one term of election.Run that ended, for why.
func (t *Telemetry) SteppedDown(ctx context.Context, why StepDown) {
	if t == nil || !t.ins.stepdowns.Enabled(ctx) {
		return
	}
	t.ins.stepdowns.Add(ctx, 1, t.byStep[why]...)
}

// Attempt is one acquisition or release under way, from Begin* to End. Its zero value
// records nothing.
type Attempt struct {
	t       *Telemetry
	ctx     context.Context // the caller's, to tell a cancellation
	span    trace.Span      // nil unless traced
	start   time.Time       // zero unless timed
	waiting bool            // counted among the waiters
	release bool
	token   int64 // of the hold granted, for the span
}

// BeginWait starts a blocking acquisition: timed, counted among the waiters until End, and
// traced as a span named spanName (see startSpan). It returns the context to acquire with,
// which carries the span.
func (t *Telemetry) BeginWait(ctx context.Context, spanName string) (context.Context, Attempt) {
	ctx, a := t.begin(ctx, spanName, false)
	if a.t != nil && t.ins.waiters.Enabled(ctx) {
		t.ins.waiters.Add(ctx, 1, t.plain...)
		a.waiting = true
	}
	return ctx, a
}

// BeginTry starts an acquisition that does not wait: timed and traced as BeginWait.
func (t *Telemetry) BeginTry(ctx context.Context, spanName string) (context.Context, Attempt) {
	return t.begin(ctx, spanName, false)
}

// BeginRelease starts a release: traced only.
func (t *Telemetry) BeginRelease(ctx context.Context, spanName string) (context.Context, Attempt) {
	return t.begin(ctx, spanName, true)
}

func (t *Telemetry) begin(ctx context.Context, spanName string, release bool) (context.Context, Attempt) {
	if t == nil {
		return ctx, Attempt{}
	}
	a := Attempt{t: t, ctx: ctx, release: release}
	if !release && t.ins.acquire.Enabled(ctx) {
		a.start = time.Now()
	}
	ctx, a.span = startSpan(ctx, spanName, t.attrs)
	return ctx, a
}

// enqueued records where a blocking acquisition joined the line: ahead keys (units) were
// ahead of its key, created at rev. An event of the span ctx carries, if it records.
func (t *Telemetry) enqueued(ctx context.Context, ahead int, rev int64) {
	if t == nil {
		return
	}
	if t.ins.ahead.Enabled(ctx) {
		t.ins.ahead.Record(ctx, int64(ahead), t.plainRec...)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("etcdsync.enqueued", trace.WithAttributes(attrAhead.Int(ahead), attrToken.Int64(rev)))
	}
}

// Held counts h, the hold the acquisition was granted, among the holds (see
// Telemetry.Held), and notes its token for the span.
func (a *Attempt) Held(h *Hold) {
	if a.t == nil || h == nil {
		return
	}
	a.t.Held(h)
	a.token = h.Token()
}

// End ends the attempt with the error its call returns: it records the wait's duration by
// outcome, takes it off the waiters, and ends the span with the outcome (and the token of
// the hold granted, if any).
func (a *Attempt) End(err error) {
	if a.t == nil {
		return
	}
	o := a.outcome(err)
	if !a.start.IsZero() {
		a.t.ins.acquire.Record(a.ctx, time.Since(a.start).Seconds(), a.t.byOutcome[o]...)
	}
	if a.waiting {
		a.t.ins.waiters.Add(a.ctx, -1, a.t.plain...)
	}
	if a.span != nil {
		endSpan(a.span, a.t.outcomeKV[o], o == failed, err, a.token)
	}
}

// outcome classifies the error of an acquisition or a release.
func (a *Attempt) outcome(err error) outcome {
	switch {
	case err == nil && a.release:
		return released
	case err == nil:
		return acquired
	case a.release && errors.Is(err, ErrLost):
		return lostHold
	case !a.release && (errors.Is(err, ErrLocked) || errors.Is(err, ErrNoPermits)):
		return busy
	case a.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return canceled
	}
	return failed
}

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
