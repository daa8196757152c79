package core

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Enqueued is Telemetry.enqueued, for the allocation test.
func (t *Telemetry) Enqueued(ctx context.Context, ahead int, rev int64) { t.enqueued(ctx, ahead, rev) }

// ClockSees records an answer with header h in a new clock's history, one after the other,
// and returns what linear said of each.
func ClockSees(headers ...*pb.ResponseHeader) []error {
	var c clock
	errs := make([]error, len(headers))
	for i, h := range headers {
		errs[i] = c.linear(h, 0)
	}
	return errs
}
