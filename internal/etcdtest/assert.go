package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Revision is the cluster's current revision, as cli reads it: unchanged between two calls
// means nothing was written in between.
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
