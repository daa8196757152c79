package core

import "context"

// Transient is transient, for the tests of package core_test.
var Transient = transient

// Enqueued is Telemetry.enqueued, for the allocation test.
func (t *Telemetry) Enqueued(ctx context.Context, ahead int, rev int64) { t.enqueued(ctx, ahead, rev) }
