package etcdtest

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A gate stands in front of an embedded member's gRPC handlers, so that a hard stop can end
// them before the member closes its storage. embed's HardStop closes the backend while the
// client servers still serve, and a handler that reads it then (a watch sending an event's
// previous value, or checking a watch's permission with auth on) dereferences a closed bolt
// transaction and crashes the whole test process: etcd 3.7.3, not something a real crash
// does. A gate lets no new call through once shut, ends the streams under way and waits for
// the handlers to return before HardStop runs; the member's peers see nothing of it.
type gate struct {
	mu       sync.Mutex
	shut     bool
	handlers sync.WaitGroup
	ctx      context.Context // ends every stream when the gate shuts
	end      context.CancelFunc
}

// gateDrain bounds how long shutGate waits for the handlers under way to return.
const gateDrain = 5 * time.Second

func newGate() *gate {
	ctx, end := context.WithCancel(context.Background())
	return &gate{ctx: ctx, end: end}
}

// serverOptions are the interceptors that put the member's handlers behind g, and, for a
// graceful stop (Close stops the client servers before the member), a server that waits
// for its handlers to return when it stops.
func (g *gate) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(g.unary), grpc.ChainStreamInterceptor(g.stream), grpc.WaitForHandlers(true),
	}
}

func (g *gate) enter() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return status.Error(codes.Unavailable, "etcdtest: member stopping")
	}
	g.handlers.Add(1)
	return nil
}

func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.handlers.Done()
	return handler(ctx, req)
}

func (g *gate) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.enter(); err != nil {
		return err
	}
	defer g.handlers.Done()
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	return handler(srv, gatedStream{ss, ctx})
}

// gatedStream is a server stream whose context also ends when its gate shuts.
type gatedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s gatedStream) Context() context.Context { return s.ctx }

// close lets no new call through, ends the streams under way and waits up to gateDrain for
// every handler to return.
func (g *gate) close() {
	g.mu.Lock()
	g.shut = true
	g.mu.Unlock()
	g.end()
	drained := make(chan struct{})
	go func() {
		g.handlers.Wait()
		close(drained)
	}()
	t := time.NewTimer(gateDrain)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
	}
}

// streamLoops are the functions of etcd's gRPC services that read a stream in a goroutine
// of their own, which outlives its handler: a watch's receive loop reads the backend to
// check a new watch's permission with auth on (etcd 3.6.0 crashed the process so, when the
// request came in just as the cluster's last member closed its backend).
var streamLoops = []string{"v3rpc.(*serverWatchStream).recvLoop", "v3rpc.(*serverWatchStream).sendLoop"}

// awaitStreamLoops waits, up to d, until no goroutine of the process runs one of
// streamLoops: once every member's gate has shut, their streams end and so do the loops.
// Only for a stop of every member at once: other members' streams would keep theirs.
func awaitStreamLoops(d time.Duration) {
	deadline := time.Now().Add(d)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		for n == len(buf) && len(buf) < 64<<20 {
			buf = make([]byte, 2*len(buf))
			n = runtime.Stack(buf, true)
		}
		stacks := string(buf[:n])
		left := false
		for _, f := range streamLoops {
			left = left || strings.Contains(stacks, f)
		}
		if !left || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond) // a poll of the process's goroutines: nothing to await
	}
}
