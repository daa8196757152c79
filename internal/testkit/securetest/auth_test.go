package securetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// TestGrantedPrefixServesItsUser: user app, whose role grants READWRITE on "app/" only,
// contends through every primitive with WithPrefix("app/") on a name holding '/', on two
// clients of its own, as any client would on an open cluster; the keys live under
// "app/" + the escaped name + "/" and none is left.
func TestGrantedPrefixServesItsUser(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			name := "jobs/nightly/" + k.Name
			app := []core.Option{k.WithPrefix(appPrefix)}
			contend(t, k, side{cluster.ClientAs(t, appUser), app}, side{cluster.ClientAs(t, appUser), app}, cluster.Client(t),
				name, appPrefix+core.NamePrefix(name))
		})
	}
}

// TestGrantedPrefixKeepsNestedNamesApart: under the grant, a name and a name below it
// ("jobs" and "jobs/nightly") are two locks: both are held at once, each with its keys
// under its own prefix.
func TestGrantedPrefixKeepsNestedNamesApart(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			ctx := etcdtest.Context(t)
			admin := cluster.Client(t)
			parent := "jobs-" + k.Name
			child := parent + "/nightly"
			inner := k.First.Make(t, cluster.ClientAs(t, appUser), child, k.WithPrefix(appPrefix))
			outer := k.Second.Make(t, cluster.ClientAs(t, appUser), parent, k.WithPrefix(appPrefix))
			require.NoError(t, inner.Lock(ctx))
			require.NoError(t, etcdtest.Within(t, etcdtest.Async(func() error { return outer.Lock(ctx) }), served,
				"the parent name taken while the child is held"))
			for _, name := range []string{parent, child} {
				assert.Equal(t, int64(1), count(t, admin, appPrefix+core.NamePrefix(name))-limitRecords(k), "keys of %q", name)
			}
			require.NoError(t, inner.Unlock(ctx))
			require.NoError(t, outer.Unlock(ctx))
			assertNoLockKeys(t, admin, appPrefix+core.NamePrefix(parent))
			assertNoLockKeys(t, admin, appPrefix+core.NamePrefix(child))
		})
	}
}

// limitRecords is the number of keys a name of kind k keeps besides its holders' and
// waiters': a semaphore's limit record and its marker.
func limitRecords(k primtest.Kind) int64 {
	if k.Name == "semaphore" {
		return 2
	}
	return 0
}

// TestOutsideGrantIsRefusedAtOnce: user app, without WithPrefix or with WithPrefix("other/"),
// is refused every acquisition (waiting and trying, first and second kind) within a few
// seconds with an error matching rpctypes.ErrPermissionDenied, and nothing is written.
func TestOutsideGrantIsRefusedAtOnce(t *testing.T) {
	for _, k := range primtest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			cli, admin := cluster.ClientAs(t, appUser), cluster.Client(t)
			name := "jobs/" + k.Name
			for _, place := range []struct {
				name string
				opts []core.Option
				keys string
			}{
				{"root", nil, core.NamePrefix(name)},
				{"other", []core.Option{k.WithPrefix(otherPrefix)}, otherPrefix + core.NamePrefix(name)},
			} {
				rev := etcdtest.Revision(t, admin)
				for i, l := range []primtest.Locker{k.First.Make(t, cli, name, place.opts...), k.Second.Make(t, cli, name, place.opts...)} {
					assertRefused(t, func(ctx context.Context) error { return l.Lock(ctx) }, "%s: lock %d", place.name, i)
					assertRefused(t, func(ctx context.Context) error {
						if err := l.TryLock(ctx); !errors.Is(err, primtest.ErrNoTry) {
							return err
						}
						return rpctypes.ErrPermissionDenied // nothing to try
					}, "%s: try %d", place.name, i)
				}
				etcdtest.NoWrites(t, admin, rev, place.name+": written to")
				assert.Zero(t, count(t, admin, place.keys), "%s: keys left", place.name)
			}
		})
	}
}

// assertRefused checks that call returns within refusedWithin an error matching
// ErrPermissionDenied. A call still running then is cancelled, and awaited.
func assertRefused(t *testing.T, call func(context.Context) error, msgAndArgs ...any) {
	t.Helper()
	ctx, cancel := context.WithCancel(etcdtest.Context(t))
	defer cancel()
	start := time.Now()
	done := etcdtest.Async(func() error { return call(ctx) })
	select {
	case err := <-done:
		assert.ErrorIs(t, err, rpctypes.ErrPermissionDenied, msgAndArgs...)
		t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(refusedWithin):
		cancel()
		err := <-done
		assert.Fail(t, "not refused within "+refusedWithin.String()+", cancelled: "+errString(err), msgAndArgs...)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestElectionInsideGrant: Campaign, Proclaim, Leader, Observe and Resign of two candidates
// of user app, with WithPrefix("app/"), on a name holding '/'.
func TestElectionInsideGrant(t *testing.T) {
	name := "jobs/leader"
	runElection(t, cluster.ClientAs(t, appUser), cluster.ClientAs(t, appUser), cluster.Client(t),
		name, appPrefix+core.NamePrefix(name), election.WithPrefix(appPrefix))
}

// TestElectionOutsideGrant: outside its grant, user app cannot read who leads (Leader is
// refused with ErrPermissionDenied) nor follow it: Observe closes its channel within a few
// seconds, having sent nothing. Proclaim and Resign without leadership say ErrNotLeader.
// Nothing is written. (Campaign is in TestOutsideGrantIsRefusedAtOnce.)
func TestElectionOutsideGrant(t *testing.T) {
	cli, admin := cluster.ClientAs(t, appUser), cluster.Client(t)
	ctx := etcdtest.Context(t)
	rev := etcdtest.Revision(t, admin)
	for _, opts := range [][]core.Option{nil, {election.WithPrefix(otherPrefix)}} {
		e, err := election.New(cli, "jobs/leader", opts...)
		require.NoError(t, err)
		assertRefused(t, func(ctx context.Context) error { _, err := e.Leader(ctx); return err }, "Leader")

		octx, cancel := context.WithCancel(ctx)
		obs := e.Observe(octx)
		select {
		case l, ok := <-obs:
			assert.False(t, ok, "Observe sent %+v", l)
		case <-time.After(refusedWithin):
			t.Errorf("Observe still open after %v", refusedWithin)
		}
		cancel()
		for range obs { // closes once ctx is cancelled, in any case
		}

		assert.ErrorIs(t, e.Proclaim(ctx, "v"), election.ErrNotLeader)
		assert.ErrorIs(t, e.Resign(ctx), election.ErrNotLeader)
	}
	etcdtest.NoWrites(t, admin, rev, "written to")
}
