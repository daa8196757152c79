package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CountKeys returns how many keys prefix holds; it fails tb if etcd cannot say.
func CountKeys(tb testing.TB, cli *clientv3.Client, prefix string) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		tb.Fatalf("count the keys under %q: %v", prefix, err)
	}
	return resp.Count
}

// AwaitKeys returns once prefix holds n keys, woken by watch events rather than polling; it
// fails tb if that takes more than 20 s.
func AwaitKeys(tb testing.TB, cli *clientv3.Client, prefix string, n int64) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	for {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			tb.Fatalf("count the keys under %q: %v", prefix, err)
		}
		if resp.Count == n {
			return
		}
		select {
		case _, ok := <-wch:
			if !ok {
				tb.Fatalf("%q never had %d keys (has %d)", prefix, n, resp.Count)
			}
		case <-ctx.Done():
			tb.Fatalf("%q never had %d keys (has %d)", prefix, n, resp.Count)
		}
	}
}

// Context is a context for one test: it ends after a minute, or when the test does.
func Context(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}
