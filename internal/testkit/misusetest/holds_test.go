package misusetest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
	"github.com/etcdsync/etcdsync/mutex"
	"github.com/etcdsync/etcdsync/reentrant"
	"github.com/etcdsync/etcdsync/rwmutex"
	"github.com/etcdsync/etcdsync/semaphore"
)

// A holdKind is one way to hold a name, reduced to what the tests of held handles need.
type holdKind struct {
	name string
	// prefix is where the keys of name live, for an Injector's rules and for counting.
	prefix func(name string) string
	take   func(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held
	// shutdown is the package's Shutdown.
	shutdown func(context.Context, *clientv3.Client) error
}

// held is a hold taken through a handle.
type held struct {
	release func(ctx context.Context) error // Unlock, RUnlock, Release or Resign
	done    func() <-chan struct{}
	err     func() error
}

var holdKinds = []holdKind{
	{"mutex", core.NamePrefix, takeMutex, mutex.Shutdown},
	{"rwmutex/write", core.NamePrefix, takeWrite, rwmutex.Shutdown},
	{"rwmutex/read", core.NamePrefix, takeRead, rwmutex.Shutdown},
	{"reentrant", core.NamePrefix, takeReentrant, reentrant.Shutdown},
	{"semaphore", func(name string) string { return core.NamePrefix(name) + core.KindPermit }, takePermit, semaphore.Shutdown},
	{"election", core.NamePrefix, takeLeadership, election.Shutdown},
	{"mutex.multi", core.NamePrefix, takeMulti, mutex.Shutdown},
}

func takeMutex(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	m, err := mutex.New(cli, name)
	require.NoError(t, err)
	require.NoError(t, m.Lock(ctx))
	return held{m.Unlock, m.Done, m.Err}
}

// takeMulti holds name and a partner name at once; the rules and counts are about name.
func takeMulti(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	m, err := mutex.NewMulti(cli, []string{name, primtest.MultiPartner(name)})
	require.NoError(t, err)
	require.NoError(t, m.Lock(ctx))
	return held{m.Unlock, m.Done, m.Err}
}

func takeWrite(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	rw, err := rwmutex.New(cli, name)
	require.NoError(t, err)
	require.NoError(t, rw.Lock(ctx))
	return held{rw.Unlock, rw.Done, rw.Err}
}

func takeRead(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	rw, err := rwmutex.New(cli, name)
	require.NoError(t, err)
	require.NoError(t, rw.RLock(ctx))
	return held{rw.RUnlock, rw.Done, rw.Err}
}

// takeReentrant's release unlocks with a context derived from the owning one, carrying the
// caller's cancellation.
func takeReentrant(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	m, err := reentrant.New(cli, name)
	require.NoError(t, err)
	owner, err := m.Lock(ctx)
	require.NoError(t, err)
	return held{func(ctx context.Context) error { return m.Unlock(withCancelOf(owner, ctx)) }, m.Done, m.Err}
}

func takePermit(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	s, err := semaphore.New(cli, name, 1)
	require.NoError(t, err)
	p, err := s.Acquire(ctx)
	require.NoError(t, err)
	return held{p.Release, p.Done, p.Err}
}

func takeLeadership(t *testing.T, ctx context.Context, cli *clientv3.Client, name string) held {
	e, err := election.New(cli, name)
	require.NoError(t, err)
	require.NoError(t, e.Campaign(ctx, "leader"))
	return held{e.Resign, e.Done, e.Err}
}

// withCancelOf is a context with the values of values that ends when ctx ends.
func withCancelOf(values, ctx context.Context) context.Context {
	merged, cancel := context.WithCancelCause(values)
	context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	return merged
}
