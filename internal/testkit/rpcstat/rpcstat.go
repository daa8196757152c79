// Package rpcstat counts the gRPC calls an etcd client makes, by method, for benchmarks
// that report RPCs per operation and for tests that bound what an operation sends.
package rpcstat

import (
	"context"
	"path"
	"sort"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// Counter counts unary calls by method ("Txn", "Range", ...), streams opened ("Watch",
// "LeaseKeepAlive"), the messages sent on them ("Watch.send": watch creates and cancels)
// and the events received on watch streams ("Watch.events"). Its zero value is ready; it is
// safe for concurrent use.
//
// A client also sends requests that no call of the test made, whenever its background
// work runs: a hold's watch set up, a watch's catch-up read, lease renewals, the read that
// settles the cluster's clock. A test that bounds what its own calls send counts them
// apart, by the ctx they were made with ([WithLabel], [Counter.Labelled]) or by the keys
// they name ([Counter.Track], [Counter.Under]).
type Counter struct {
	mu       sync.Mutex
	n        map[string]int64
	labelled map[string]Counts // by the label of the call's ctx
	tracked  map[string]Counts // by a tracked prefix of a key the request names
}

type labelKey struct{}

// WithLabel returns a child of ctx whose unary calls every Counter also counts under label.
// The calls made on a ctx derived from it carry the label too, so an operation's retries
// and the requests it sends on a detached copy of its ctx count as its own; the work a
// client does on contexts of its own does not.
func WithLabel(ctx context.Context, label string) context.Context {
	return context.WithValue(ctx, labelKey{}, label)
}

// add counts a call of what; ctx is the call's (nil for a stream's, whose opener is any
// caller that found no stream), req its request or message (nil when it has none).
func (c *Counter) add(ctx context.Context, what string, req any) {
	label, labelled := "", false
	if ctx != nil {
		label, labelled = ctx.Value(labelKey{}).(string)
	}
	keys := keysOf(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count(what, 1)
	if labelled {
		if c.labelled == nil {
			c.labelled = map[string]Counts{}
		}
		if c.labelled[label] == nil {
			c.labelled[label] = Counts{}
		}
		c.labelled[label][what]++
	}
	for prefix, counts := range c.tracked {
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				counts[what]++
				break
			}
		}
	}
}

// count adds n to the count of what. Under c.mu.
func (c *Counter) count(what string, n int64) {
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[what] += n
}

// DialOptions install the counter on a client: append them to clientv3.Config.DialOptions.
func (c *Counter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.add(ctx, path.Base(method), req)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			name := path.Base(method)
			// A client shares one stream among its callers: it is no one's own.
			c.add(nil, name, nil)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &countedStream{ClientStream: s, c: c, send: name + ".send"}, nil
		}),
	}
}

type countedStream struct {
	grpc.ClientStream
	c    *Counter
	send string
}

func (s *countedStream) SendMsg(m any) error {
	s.c.add(nil, s.send, m)
	return s.ClientStream.SendMsg(m)
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if wr, ok := m.(*pb.WatchResponse); ok && err == nil && len(wr.Events) > 0 {
		s.c.mu.Lock()
		s.c.count("Watch.events", int64(len(wr.Events)))
		s.c.mu.Unlock()
	}
	return err
}

// Labelled is a copy of the counts of the unary calls made on a ctx labelled label by
// [WithLabel].
func (c *Counter) Labelled(label string) Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.labelled[label].copy()
}

// Track makes c count apart, from now on, the requests that name a key under prefix as
// etcd sees it (behind the client's namespace, if it has one): a Range, Put or DeleteRange
// from such a key, a Txn with a compare or an op on one, a watch created on one.
func (c *Counter) Track(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tracked == nil {
		c.tracked = map[string]Counts{}
	}
	if c.tracked[prefix] == nil {
		c.tracked[prefix] = Counts{}
	}
}

// Under is a copy of the counts of the requests that named a key under prefix since
// [Counter.Track] was called with it; empty for a prefix not tracked.
func (c *Counter) Under(prefix string) Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tracked[prefix].copy()
}

// keysOf lists the keys a request names; a range names its first key.
func keysOf(req any) []string {
	switch r := req.(type) {
	case *pb.RangeRequest:
		return []string{string(r.Key)}
	case *pb.PutRequest:
		return []string{string(r.Key)}
	case *pb.DeleteRangeRequest:
		return []string{string(r.Key)}
	case *pb.TxnRequest:
		var keys []string
		for _, cmp := range r.Compare {
			keys = append(keys, string(cmp.Key))
		}
		for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
			for _, op := range ops {
				keys = append(keys, opKeys(op)...)
			}
		}
		return keys
	case *pb.WatchRequest:
		if cr := r.GetCreateRequest(); cr != nil {
			return []string{string(cr.Key)}
		}
	}
	return nil
}

func opKeys(op *pb.RequestOp) []string {
	switch {
	case op.GetRequestRange() != nil:
		return keysOf(op.GetRequestRange())
	case op.GetRequestPut() != nil:
		return keysOf(op.GetRequestPut())
	case op.GetRequestDeleteRange() != nil:
		return keysOf(op.GetRequestDeleteRange())
	case op.GetRequestTxn() != nil:
		return keysOf(op.GetRequestTxn())
	}
	return nil
}

// Counts is a copy of the counts so far.
func (c *Counter) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Counts(c.n).copy()
}

// Counts maps a method to a number of calls.
type Counts map[string]int64

func (c Counts) copy() Counts {
	out := make(Counts, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}

// Sub returns the counts of c less those of before.
func (c Counts) Sub(before Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Add adds o to c.
func (c Counts) Add(o Counts) {
	for k, v := range o {
		c[k] += v
	}
}

// Methods lists the methods counted, sorted.
func (c Counts) Methods() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
