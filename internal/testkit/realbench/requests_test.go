package realbench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/etcdsync/etcdsync/mutex"
)

// BenchmarkMutexUncontendedRequests: the requests of one uncontended cycle alone, as each
// library sends them, without the library. A client of each library's own locks and unlocks
// once while its KV requests are recorded; the rounds then send those requests again
// through the KV API of a bare gRPC client (ours: the lock's Txn, then the release's Txn
// with its compare set to the create revision the lock's answer gave; etcd's Mutex: its Txn,
// then its DeleteRange). Beside BenchmarkMutexUncontended, it tells what each library's own
// path costs over its requests, and what the requests cost against each other.
func BenchmarkMutexUncontendedRequests(b *testing.B) {
	forEachCluster(b, func(b *testing.B, t *target) {
		ctx := context.Background()
		ours, etcd := t.clients(b, 1, 0), t.clients(b, 1, 0)
		var oursWork, etcdWork func(context.Context) error
		{
			rec, cli := t.recordingClient(b)
			m, err := mutex.New(cli, "mutex", mutex.WithPrefix(t.root))
			must(b, err)
			must(b, exclusiveCycle(m, nil)(ctx)) // the lease's grant
			reqs := rec.during(b, func() error { return exclusiveCycle(m, nil)(ctx) })
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				must(b, mutex.Shutdown(ctx, cli))
			})
			lock, release := txnOf(b, reqs, 0), txnOf(b, reqs, 1)
			if len(reqs) != 2 || len(release.Compare) != 1 || release.Compare[0].Target != pb.Compare_CREATE {
				b.Fatalf("realbench: our uncontended cycle sent %d requests, its release %v: want a lock's Txn and a release fenced on the key's create revision", len(reqs), release)
			}
			kv := pb.NewKVClient(ours[0].ActiveConnection()) // a bare client; ours' counts see its calls
			oursWork = func(ctx context.Context) error {
				resp, err := kv.Txn(ctx, lock)
				if err != nil || !resp.Succeeded {
					return fmt.Errorf("our lock's Txn: %v (succeeded: %v)", err, resp.GetSucceeded())
				}
				release.Compare[0].TargetUnion = &pb.Compare_CreateRevision{CreateRevision: resp.Header.Revision}
				if resp, err := kv.Txn(ctx, release); err != nil || !resp.Succeeded {
					return fmt.Errorf("our release's Txn: %v (succeeded: %v)", err, resp.GetSucceeded())
				}
				return nil
			}
		}
		{
			rec, cli := t.recordingClient(b)
			s, err := concurrency.NewSession(cli)
			must(b, err)
			b.Cleanup(func() { s.Close() })
			m := concurrency.NewMutex(s, t.root+"etcd-mutex")
			reqs := rec.during(b, func() error { return exclusiveCycle(m, nil)(ctx) })
			lock := txnOf(b, reqs, 0)
			del, ok := reqs[len(reqs)-1].(*pb.DeleteRangeRequest)
			if len(reqs) != 2 || !ok {
				b.Fatalf("realbench: etcd's uncontended cycle sent %d requests (%T last): want a Txn and a DeleteRange", len(reqs), reqs[len(reqs)-1])
			}
			kv := pb.NewKVClient(etcd[0].ActiveConnection())
			etcdWork = func(ctx context.Context) error {
				if _, err := kv.Txn(ctx, lock); err != nil {
					return fmt.Errorf("etcd's lock's Txn: %w", err)
				}
				if _, err := kv.DeleteRange(ctx, del); err != nil {
					return fmt.Errorf("etcd's DeleteRange: %w", err)
				}
				return nil
			}
		}
		oursW, etcdW := []func(context.Context) error{oursWork}, []func(context.Context) error{etcdWork}
		warm(b, ctx, oursW, etcdW)
		t.measure(b, comparison{
			ours:    loopSide("ours", "cycle", ours, oursW),
			rival:   loopSide("etcd", "cycle", etcd, etcdW),
			commits: t.commitSides(b),
		})
	})
}

// A recorder keeps the KV requests its client sends while it records.
type recorder struct {
	mu   sync.Mutex
	on   bool
	reqs []any
}

// during records the KV requests that fn sends, and returns them.
func (r *recorder) during(b *testing.B, fn func() error) []any {
	r.mu.Lock()
	r.on, r.reqs = true, nil
	r.mu.Unlock()
	must(b, fn())
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.reqs
}

func (r *recorder) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r.mu.Lock()
	if r.on && strings.HasPrefix(method, "/etcdserverpb.KV/") {
		r.reqs = append(r.reqs, req)
	}
	r.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// recordingClient is a client of member 0 whose KV requests the returned recorder can
// record; it closes when b ends.
func (t *target) recordingClient(b *testing.B) (*recorder, *clientv3.Client) {
	rec := &recorder{}
	cfg := plainConfig(t.cluster, t.cluster.Endpoints()[:1])
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(rec.intercept))
	cli, err := clientv3.New(cfg)
	must(b, err)
	b.Cleanup(func() { cli.Close() })
	return rec, cli
}

// txnOf is the i-th request of reqs, which must be a Txn.
func txnOf(b *testing.B, reqs []any, i int) *pb.TxnRequest {
	if i >= len(reqs) {
		b.Fatalf("realbench: %d requests recorded, want a Txn at %d", len(reqs), i)
	}
	t, ok := reqs[i].(*pb.TxnRequest)
	if !ok {
		b.Fatalf("realbench: request %d is a %T, want a Txn", i, reqs[i])
	}
	return t
}
