// Package rpcstat counts the gRPC calls an etcd client makes, by method, for benchmarks
// that report RPCs per operation.
package rpcstat

import (
	"context"
	"path"
	"sort"
	"sync"

	"google.golang.org/grpc"
)

// Counter counts unary calls by method ("Txn", "Range", ...), streams opened ("Watch",
// "LeaseKeepAlive") and the messages sent on them ("Watch.send": watch creates and
// cancels). Its zero value is ready; it is safe for concurrent use.
type Counter struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *Counter) add(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[what]++
}

// DialOptions install the counter on a client: append them to clientv3.Config.DialOptions.
func (c *Counter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.add(path.Base(method))
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			name := path.Base(method)
			c.add(name)
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
	s.c.add(s.send)
	return s.ClientStream.SendMsg(m)
}

// Counts is a copy of the counts so far.
func (c *Counter) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(Counts, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// Counts maps a method to a number of calls.
type Counts map[string]int64

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
