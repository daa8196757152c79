package etcdtest

import (
	"bytes"
	"context"
	"path"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// An Injector disturbs the RPCs of the clients it is installed on, exactly where a test
// says: an answer that comes late or never, a request applied after the caller gave up, a
// refusal, a stream that never opens. A real etcd serves every request that is sent; only
// what the client sees, and when it is sent, is changed. Its zero value has no rules.
//
// Install it with DialOptions (or Client), then Add rules; a call matches the first rule
// whose Method and Match fit, and each rule applies to Times calls (0: every call) until
// it is removed.
type Injector struct {
	mu    sync.Mutex
	rules []*Rule
	late  sync.WaitGroup // requests sent after their caller gave up, still under way
	// prefix is the namespace of the client Client opened: cut from the keys of a request
	// before a rule's Match sees it, so that rules name keys as the test wrote them.
	prefix string
}

// Action is what an Injector does to a call that matches a rule.
type Action int

const (
	// Delay sends the request at once and hands its answer to the caller Delay later.
	Delay Action = iota
	// Hold keeps the request for Delay before it sends it, on the caller's context.
	Hold
	// Drop sends the request, which etcd applies, but never hands the answer over: the
	// caller waits until its context ends.
	Drop
	// Lose never sends the request: the caller waits until its context ends.
	Lose
	// Late answers the caller at once with an Unavailable error (as a connection that
	// broke would), and sends the request Delay later, on a context of its own: etcd
	// applies it after the caller gave up.
	Late
	// Refuse answers the caller at once with Err (a gRPC status), sending nothing.
	Refuse
)

// Rule is one disturbance.
type Rule struct {
	Method string // the RPC's last path element: "Txn", "Range", "DeleteRange", "LeaseRevoke", "Watch", "LeaseKeepAlive", ...
	// Match, if set, must accept the request (a *pb.TxnRequest, ...); streams match on
	// Method alone.
	Match  func(req any) bool
	Action Action
	Delay  time.Duration
	Err    error // for Refuse; codes.PermissionDenied if nil
	// Until, for Hold, is what the request waits for instead of Delay.
	Until <-chan struct{}
	// Matched, if set, is called (outside the injector's lock) for every call that matches.
	Matched func()
	// Answered, if set, is called for every unary call of Delay that matches, once etcd's
	// answer came (before the Delay).
	Answered func()
	Times    int // how many calls it applies to; 0 for every call until removed

	hits int
}

// Add adds r and returns the function that removes it.
func (inj *Injector) Add(r Rule) (remove func()) {
	rp := &r
	inj.mu.Lock()
	inj.rules = append(inj.rules, rp)
	inj.mu.Unlock()
	return func() {
		inj.mu.Lock()
		defer inj.mu.Unlock()
		for i, x := range inj.rules {
			if x == rp {
				inj.rules = append(inj.rules[:i], inj.rules[i+1:]...)
				return
			}
		}
	}
}

// Clear removes every rule.
func (inj *Injector) Clear() {
	inj.mu.Lock()
	inj.rules = nil
	inj.mu.Unlock()
}

// match returns the rule that applies to a call, counting it, or nil.
func (inj *Injector) match(method string, req any) *Rule {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for i, r := range inj.rules {
		if r.Method != method || (r.Match != nil && (req == nil || !r.Match(relative(req, inj.prefix)))) {
			continue
		}
		r.hits++
		if r.Times > 0 && r.hits >= r.Times {
			inj.rules = append(inj.rules[:i], inj.rules[i+1:]...)
		}
		return r
	}
	return nil
}

// Settle waits until every request sent late (Late) has been answered.
func (inj *Injector) Settle() { inj.late.Wait() }

// DialOptions install the injector on a client: append them to clientv3.Config.DialOptions.
func (inj *Injector) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(inj.unary),
		grpc.WithChainStreamInterceptor(inj.stream),
	}
}

// Client opens a client of the cluster with the injector installed, closed in tb.Cleanup
// after every late request is settled. On an external cluster the client works inside the
// cluster's Prefix, as every client of the cluster does, and rules match on keys without it.
// An injector serves one cluster's clients.
func (inj *Injector) Client(tb testing.TB, c *Cluster) *clientv3.Client {
	tb.Helper()
	cfg := c.ClientConfig()
	cfg.DialOptions = append(cfg.DialOptions, inj.DialOptions()...)
	inj.mu.Lock()
	inj.prefix = c.Prefix()
	inj.mu.Unlock()
	cli := c.openFor(tb, cfg)
	tb.Cleanup(inj.Settle) // registered after the client's Close, so it runs before it
	return cli
}

// relative returns req as the caller of a client namespaced under prefix wrote it: a copy
// with prefix cut from every key and range end, or req itself when there is no prefix.
func relative(req any, prefix string) any {
	m, ok := req.(protoadapt.MessageV1) // the messages of etcd 3.6's API and of 3.7's
	if prefix == "" || !ok {
		return req
	}
	c := protoadapt.MessageV1Of(proto.Clone(protoadapt.MessageV2Of(m)))
	cut := func(b []byte) []byte { return bytes.TrimPrefix(b, []byte(prefix)) }
	var txn func(*pb.TxnRequest)
	op := func(o *pb.RequestOp) {
		if r := o.GetRequestRange(); r != nil {
			r.Key, r.RangeEnd = cut(r.Key), cut(r.RangeEnd)
		}
		if r := o.GetRequestPut(); r != nil {
			r.Key = cut(r.Key)
		}
		if r := o.GetRequestDeleteRange(); r != nil {
			r.Key, r.RangeEnd = cut(r.Key), cut(r.RangeEnd)
		}
		if r := o.GetRequestTxn(); r != nil {
			txn(r)
		}
	}
	txn = func(t *pb.TxnRequest) {
		for _, cmp := range t.Compare {
			cmp.Key, cmp.RangeEnd = cut(cmp.Key), cut(cmp.RangeEnd)
		}
		for _, o := range t.Success {
			op(o)
		}
		for _, o := range t.Failure {
			op(o)
		}
	}
	switch r := c.(type) {
	case *pb.TxnRequest:
		txn(r)
	case *pb.RangeRequest:
		r.Key, r.RangeEnd = cut(r.Key), cut(r.RangeEnd)
	case *pb.PutRequest:
		r.Key = cut(r.Key)
	case *pb.DeleteRangeRequest:
		r.Key, r.RangeEnd = cut(r.Key), cut(r.RangeEnd)
	}
	return c
}

func (inj *Injector) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r := inj.match(path.Base(method), req)
	if r == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if r.Matched != nil {
		r.Matched()
	}
	switch r.Action {
	case Delay:
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r.Answered != nil {
			r.Answered()
		}
		if werr := wait(ctx, r.Delay); werr != nil {
			return status.FromContextError(werr).Err()
		}
		return err
	case Hold:
		if err := r.hold(ctx); err != nil {
			return status.FromContextError(err).Err()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	case Drop:
		_ = invoker(ctx, method, req, reply, cc, opts...)
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	case Lose:
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	case Late:
		inj.late.Add(1)
		go func() {
			defer inj.late.Done()
			time.Sleep(r.Delay) // the point is the delay: nothing to await
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = invoker(lctx, method, req, newReply(reply), cc, opts...)
		}()
		return status.Error(codes.Unavailable, "etcdtest: injected: the connection broke before the answer")
	default: // Refuse
		if r.Err != nil {
			return r.Err
		}
		return status.Error(codes.PermissionDenied, "etcdtest: injected: permission denied")
	}
}

// newReply is a fresh reply of reply's type, for a late request whose answer nobody reads.
func newReply(reply any) any {
	switch reply.(type) {
	case *pb.TxnResponse:
		return &pb.TxnResponse{}
	case *pb.RangeResponse:
		return &pb.RangeResponse{}
	case *pb.DeleteRangeResponse:
		return &pb.DeleteRangeResponse{}
	case *pb.PutResponse:
		return &pb.PutResponse{}
	case *pb.LeaseRevokeResponse:
		return &pb.LeaseRevokeResponse{}
	case *pb.LeaseGrantResponse:
		return &pb.LeaseGrantResponse{}
	}
	return reply
}

func (inj *Injector) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	r := inj.match(path.Base(method), nil)
	if r == nil {
		return streamer(ctx, desc, cc, method, opts...)
	}
	if r.Matched != nil {
		r.Matched()
	}
	switch r.Action {
	case Hold, Delay: // the stream opens late: Delay, or until r.Until for Hold
		late := r.hold
		if r.Action == Delay {
			late = func(ctx context.Context) error { return wait(ctx, r.Delay) }
		}
		if err := late(ctx); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return streamer(ctx, desc, cc, method, opts...)
	case Refuse:
		if r.Err != nil {
			return nil, r.Err
		}
		return nil, status.Error(codes.Unavailable, "etcdtest: injected: stream refused")
	default: // Drop, Lose, Late: the stream never opens
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// hold waits for r.Until, or r.Delay without it, or until ctx ends (its error).
func (r *Rule) hold(ctx context.Context) error {
	if r.Until == nil {
		return wait(ctx, r.Delay)
	}
	select {
	case <-r.Until:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns after d, or ctx's error if it ends first.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TxnDeletesUnder matches a Txn whose success or failure ops, or those of a Txn nested in
// it, delete a key under prefix.
func TxnDeletesUnder(prefix string) func(any) bool {
	return txnTouches(prefix, func(op *pb.RequestOp) []byte { return op.GetRequestDeleteRange().GetKey() })
}

// TxnPutsUnder matches a Txn whose success or failure ops, or those of a Txn nested in it,
// put a key under prefix.
func TxnPutsUnder(prefix string) func(any) bool {
	return txnTouches(prefix, func(op *pb.RequestOp) []byte { return op.GetRequestPut().GetKey() })
}

func txnTouches(prefix string, key func(*pb.RequestOp) []byte) func(any) bool {
	return func(req any) bool {
		t, ok := req.(*pb.TxnRequest)
		if !ok {
			return false
		}
		return touches(t, prefix, key)
	}
}

// touches reports whether an op of t, or of a Txn nested in it, has a key under prefix.
func touches(t *pb.TxnRequest, prefix string, key func(*pb.RequestOp) []byte) bool {
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if k := key(op); k != nil && bytes.HasPrefix(k, []byte(prefix)) {
				return true
			}
			if nested := op.GetRequestTxn(); nested != nil && touches(nested, prefix, key) {
				return true
			}
		}
	}
	return false
}

// TxnsAnswered returns a client of c, of member alone unless member is -1, and a channel
// closed once etcd has answered n of its Txns: a wait that watches and then reads (a
// barrier's, a latch's) has read by then when its read is its n-th Txn.
func TxnsAnswered(tb testing.TB, c *Cluster, member, n int) (*clientv3.Client, <-chan struct{}) {
	tb.Helper()
	answered := make(chan struct{})
	var mu sync.Mutex
	count := 0
	inj := &Injector{}
	inj.Add(Rule{Method: "Txn", Action: Delay, Answered: func() {
		mu.Lock()
		defer mu.Unlock()
		if count++; count == n {
			close(answered)
		}
	}})
	if member < 0 {
		return inj.Client(tb, c), answered
	}
	cfg := c.ClientConfig()
	cfg.Endpoints = []string{c.Endpoints()[member]}
	cfg.DialOptions = append(cfg.DialOptions, inj.DialOptions()...)
	cli := c.openFor(tb, cfg)
	tb.Cleanup(inj.Settle)
	return cli, answered
}
