package etcdtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Revision is the cluster's current revision, as cli reads it: a point from which NoWrites
// looks. The revision counts every write on the cluster, so it stays the same between two
// calls only on a cluster that nothing else writes to: compare revisions only through
// NoWrites.
func Revision(tb testing.TB, cli *clientv3.Client) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00")
	if err != nil {
		tb.Fatalf("etcdtest: read the revision: %v", err)
	}
	return resp.Header.Revision
}

// Within returns what ch yields (or the zero value once it is closed), and fails tb unless
// that happens within d.
func Within[T any](tb testing.TB, ch <-chan T, d time.Duration, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		tb.Fatalf("%s: not within %v", what, d)
		var zero T
		return zero
	}
}

// Async runs f in a goroutine and yields its error, for Within and Pending.
func Async(f func() error) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	return errc
}

// Pending fails tb if errc has yielded: the call it stands for should still wait.
func Pending(tb testing.TB, errc <-chan error, what string) {
	tb.Helper()
	select {
	case err := <-errc:
		tb.Fatalf("%s returned (%v) while it should wait", what, err)
	default:
	}
}

// progressEvery is how often Writes asks etcd where its watch stands.
const progressEvery = 50 * time.Millisecond

// NoWrites fails tb, saying what, if anything was written in cli's keyspace (the run's
// Prefix on an external cluster, where other tests and other data write too) after revision
// since (from Revision).
func NoWrites(tb testing.TB, cli *clientv3.Client, since int64, what string) {
	tb.Helper()
	if w := Writes(tb, cli, since); len(w) > 0 {
		tb.Errorf("%s: %v", what, w)
	}
}

// Writes returns the writes in cli's keyspace after revision since and up to now ("put k",
// "delete k"), as a watch from since+1 sees them: it reads until etcd reports the watch at
// today's revision (a progress notification, or an event past it).
func Writes(tb testing.TB, cli *clientv3.Client, since int64) []string {
	tb.Helper()
	now := Revision(tb, cli)
	if now == since {
		return nil // nothing was written anywhere
	}
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), 30*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(since+1))
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	var writes []string
	for {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				tb.Fatalf("etcdtest: watch the writes after revision %d: %v (closed: %t)", since, resp.Err(), !ok)
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > now {
					return writes
				}
				writes = append(writes, fmt.Sprintf("%s %s", ev.Type, ev.Kv.Key))
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= now {
				return writes
			}
		case <-tick.C:
			// Answered only once the watch has caught up to the store (etcd 3.4 and later).
			if err := cli.RequestProgress(ctx); err != nil && ctx.Err() == nil {
				tb.Fatalf("etcdtest: ask for the watch's progress: %v", err)
			}
		case <-ctx.Done():
			tb.Fatalf("etcdtest: the writes after revision %d: no answer up to revision %d", since, now)
		}
	}
}
