package mutex

// WithoutTelemetry makes m record nothing and start no span, as the Mutex did before it
// had metrics: the baseline of BenchmarkQuietTelemetry.
func WithoutTelemetry(m *Mutex) *Mutex {
	m.tel = nil
	return m
}
