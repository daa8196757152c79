package core

import "go.etcd.io/etcd/api/v3/mvccpb"

// A subscriber is what a hub dispatches a name's events to: a queue waiter, a sentry, a
// release watch or an observer, each a small type of its own. Its methods run under the
// hub's mutex, in revision order, and must not block; a subscriber tells its owner that
// something changed through a channel of its own.
type subscriber interface {
	// since is the revision its view reflects: events at or below it are no news to it.
	since() int64
	// apply takes every event of revision rev, after since, at once: one revision can carry
	// many deletes (a lease's keys, an operator's delete of a range), and what they mean
	// together is not what each means alone.
	apply(rev int64, evs []event)
	// missed says that the events after since can no longer all be delivered.
	missed()
	// stale reports whether it waits for a read of the name (recount).
	stale() bool
	// recount renews its view from every key of the name, read at revision rev.
	recount(kvs []*mvccpb.KeyValue, rev int64)
	// fail ends it with err: the client closed, or etcd refused to read the name.
	fail(err error)
}

// event is one change of a key of the name, as the hub dispatches it.
type event struct {
	key     string
	put     bool   // a put (an arrival on a hub that delivers them, any put on a hub with values), else a delete
	created int64  // create revision of the key; 0 for a delete whose previous value etcd did not give
	rev     int64  // revision of the event
	value   string // the value put, on a hub with values
}

// signal wakes whoever waits on wake, without blocking: wake has room for one.
func signal(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
