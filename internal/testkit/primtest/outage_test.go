package primtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// outageTTL is the TTL of the holds in the outage tests: short, so that the outage outlasts
// it many times over.
const outageTTL = 5 * time.Second

// TestAMajorityOutageEndsEveryHoldBeforeAnotherIsServed stops two of three members, the
// leader among them, while one client (of every member) holds a name of every kind, waits
// for each behind its holder and observes the election. The surviving member has no leader,
// so no renewal gets through: every hold must end at its local deadline (Done closed, Err
// ErrLost saying why), every waiter of that client must fail or be served only after its
// holder was told, and once the members are back, a waiter on another client is served only
// after the holder was told, and the observer reports the new leader. Graceful stops hand
// leadership over first and let renewals through for a while; kills do not. It runs on
// embedded members, and on etcd server processes (SIGTERM and SIGKILL) when an etcd server
// is on PATH (or in $ETCDTEST_ETCD).
func TestAMajorityOutageEndsEveryHoldBeforeAnotherIsServed(t *testing.T) {
	if testing.Short() {
		t.Skip("stops and restarts members of clusters of its own: not in the short tier")
	}
	// Its few clients approach as a fleet's far-back waiters do (see package core's
	// follow.go): a waiter with more than one key ahead, on a client with no watch of the
	// name, watches a key ahead before it joins the watch.
	t.Cleanup(core.SetNearAhead(1))
	clusters := []struct {
		name  string
		start func() (*etcdtest.Cluster, error)
	}{{"embedded", func() (*etcdtest.Cluster, error) { return etcdtest.NewEmbedded(3) }}}
	if bin := etcdtest.ServerBinary(); bin != "" {
		clusters = append(clusters, struct {
			name  string
			start func() (*etcdtest.Cluster, error)
		}{"processes", func() (*etcdtest.Cluster, error) { return etcdtest.NewProcesses(3, bin) }})
	} else {
		t.Log("no etcd server on PATH: the outage runs on embedded members only")
	}
	for _, cl := range clusters {
		for _, mode := range []struct {
			name string
			cut  func(*etcdtest.Cluster, int)
		}{{"graceful stop", (*etcdtest.Cluster).Stop}, {"kill", (*etcdtest.Cluster).Kill}} {
			t.Run(cl.name+"/"+mode.name, func(t *testing.T) { majorityOutage(t, cl.start, mode.cut) })
		}
	}
}

// outageCase is one kind's part of a majority outage.
type outageCase struct {
	k        primtest.Kind
	name     string
	holder   primtest.Locker
	done     <-chan struct{}
	told     time.Time
	waiter   primtest.Locker
	waited   chan error
	servedAt time.Time // when the waiter's Lock returned nil
}

func majorityOutage(t *testing.T, start func() (*etcdtest.Cluster, error), cut func(*etcdtest.Cluster, int)) {
	c, err := start()
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := c.Client(t) // of every member

	var cases []*outageCase
	var observed <-chan election.Leader
	for _, k := range primtest.Kinds {
		oc := &outageCase{k: k, name: "outage-" + k.Name, waited: make(chan error, 1)}
		oc.holder = k.First.Make(t, cli, oc.name, k.WithTTL(outageTTL))
		require.NoError(t, oc.holder.Lock(ctx), k.Name)
		oc.done = oc.holder.Done()
		oc.waiter = k.Second.Make(t, cli, oc.name, k.WithTTL(outageTTL))
		keys := etcdtest.CountKeys(t, cli, k.Keys(oc.name))
		go func() {
			err := oc.waiter.Lock(ctx)
			if err == nil {
				oc.servedAt = time.Now()
			}
			oc.waited <- err
		}()
		if k.InLine {
			etcdtest.AwaitKeys(t, cli, k.Keys(oc.name), keys+1)
		}
		if k.Package == "election" {
			observed = newObserver(t, cli, oc.name).Observe(ctx)
			primtest.NextLeader(t, observed)
		}
		cases = append(cases, oc)
	}

	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	cutAt := time.Now()
	cut(c, leader)
	cut(c, (leader+1)%3)
	t.Logf("members %d (the leader) and %d stopped in %v", leader, (leader+1)%3, time.Since(cutAt))

	for _, oc := range cases {
		etcdtest.Within(t, oc.done, 30*time.Second, oc.k.Name+": the holder's Done")
		oc.told = time.Now()
		assert.ErrorIs(t, oc.holder.Err(), core.ErrLost, oc.k.Name)
		assert.ErrorContains(t, oc.holder.Err(), "local deadline", oc.k.Name)
		t.Logf("%s: told %v after the cut", oc.k.Name, oc.told.Sub(cutAt).Round(time.Millisecond))
	}

	require.NoError(t, c.RestartAll(leader, (leader+1)%3))

	for _, oc := range cases {
		err := etcdtest.Within(t, oc.waited, time.Minute, oc.k.Name+": the waiter's Lock")
		if err != nil {
			continue // its place in line went with the session: ErrLost, or trylock's last try
		}
		assert.True(t, oc.servedAt.After(oc.told), "%s: a waiter of the cut-off client was served before its holder was told", oc.k.Name)
		assert.NoError(t, oc.waiter.Unlock(ctx), oc.k.Name)
	}

	other := c.Client(t)
	for _, oc := range cases {
		second := oc.k.Second.Make(t, other, oc.name, oc.k.WithTTL(outageTTL))
		require.NoError(t, second.Lock(ctx), oc.k.Name)
		assert.True(t, time.Now().After(oc.told), oc.k.Name)
		if oc.k.Package == "election" {
			awaitLeaderValue(t, observed, "term-1")
		}
		assert.NoError(t, second.Unlock(ctx), oc.k.Name)
		assert.ErrorIs(t, oc.holder.Unlock(ctx), core.ErrLost, oc.k.Name)
		etcdtest.AwaitKeys(t, other, oc.k.Keys(oc.name), 0)
	}
	cancel()
}

// newObserver is an election handle on name over cli, for Observe.
func newObserver(t *testing.T, cli *clientv3.Client, name string) *election.Election {
	e, err := election.New(cli, name)
	require.NoError(t, err)
	return e
}

// awaitLeaderValue returns once obs reports a leader of value value, failing t after 30 s.
func awaitLeaderValue(t *testing.T, obs <-chan election.Leader, value string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-obs:
			if !ok {
				t.Fatal("Observe closed its channel")
			}
			if l.Value == value {
				return
			}
		case <-timeout:
			t.Fatalf("Observe did not report the leader %q within 30s", value)
		}
	}
}
