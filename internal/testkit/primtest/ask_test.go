package primtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// asker is what every lock's hold has beside the Locker: Asked.
type asker interface{ Asked() <-chan struct{} }

// askWait bounds how long an ask takes to reach its holder: a Txn and a watch event.
const askWait = 15 * time.Second

// forEachAskable runs test over every kind but the election (whose Asked is of a transfer,
// see electiontest), on a name of the test's own, with an admin client of cluster starting
// with member 0 and the holder's client starting with member 1.
func forEachAskable(t *testing.T, what string, test func(t *testing.T, k primtest.Kind, name string, holder, adm *clientv3.Client)) {
	for _, k := range primtest.Kinds {
		if k.Package == "election" {
			continue
		}
		t.Run(k.Name, func(t *testing.T) {
			test(t, k, what+"-"+k.Name, etcdtest.SpreadClient(t, cluster, 1), etcdtest.SpreadClient(t, cluster, 0))
		})
	}
}

// tokenOf is the create revision of key: the token an operator reads in etcdsync status,
// also for a read hold, whose handle has none.
func tokenOf(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "key %s", key)
	return resp.Kvs[0].CreateRevision
}

// askRecords counts the records of asks beside name.
func askRecords(t *testing.T, cli *clientv3.Client, name string) int64 {
	t.Helper()
	return etcdtest.CountKeys(t, cli, strings.TrimSuffix(core.NamePrefix(name), "/")+"\x00asked/")
}

// TestAskReachesTheHolderAndAWrongTokenNothing: an ask by a token that no key of the name
// has (one off, or the token of a hold released since) is ErrNoHold and writes nothing; an
// ask by the hold's token closes its Asked, on a client of another member, and the hold
// goes on until it is released, whose release deletes the record; without a hold Asked is
// nil.
func TestAskReachesTheHolderAndAWrongTokenNothing(t *testing.T) {
	forEachAskable(t, "ask", func(t *testing.T, k primtest.Kind, name string, holder, adm *clientv3.Client) {
		ctx := etcdtest.Context(t)
		l := k.First.Make(t, holder, name)
		require.Nil(t, l.(asker).Asked(), "no hold")

		require.NoError(t, l.Lock(ctx))
		stale := tokenOf(t, adm, l.Key())
		require.NoError(t, l.Unlock(ctx))
		require.NoError(t, l.Lock(ctx))
		asked := l.(asker).Asked()
		require.NotNil(t, asked)
		token := tokenOf(t, adm, l.Key())
		for _, wrong := range []int64{token + 1, token - 1, stale} {
			assert.ErrorIs(t, admin.Ask(ctx, adm, name, wrong, "wrong token"), admin.ErrNoHold, "token %d", wrong)
		}
		assert.Zero(t, askRecords(t, adm, name), "a wrong token writes nothing")
		select {
		case <-asked:
			t.Fatal("Asked closed without an ask of its token")
		default:
		}

		require.NoError(t, admin.Ask(ctx, adm, name, token, "deploy at 02:00"))
		etcdtest.Within(t, asked, askWait, "Asked after the ask")
		assert.Equal(t, asked, l.(asker).Asked(), "the same channel on each call")
		assert.NoError(t, l.Err(), "an ask is no loss")
		if k.Busy != nil {
			assert.ErrorIs(t, k.Second.Make(t, adm, name).TryLock(ctx), k.Busy, "the hold goes on")
		}
		assert.Equal(t, int64(1), askRecords(t, adm, name))
		require.NoError(t, l.Unlock(ctx))
		assert.Zero(t, askRecords(t, adm, name), "the release of a hold told of an ask deletes its record")

		// The next hold of the handle is not the one asked, even on the same key.
		require.NoError(t, l.Lock(ctx))
		next := l.(asker).Asked()
		select {
		case <-next:
			t.Fatal("the next hold is asked by the ask of the one before")
		default:
		}
		require.NoError(t, l.Unlock(ctx))
	})
}

// TestADoThatYieldsOnAskEndsFnsCtxAndReleases: with WithYieldOnAsk, an ask of the hold that
// a Do took ends fn's ctx, with an AskedError that quotes the ask as its cause; Do returns
// fn's error joined with it, and the key is gone. Without the option the same ask leaves
// fn's ctx alone.
func TestADoThatYieldsOnAskEndsFnsCtxAndReleases(t *testing.T) {
	forEachAskable(t, "ask-do", func(t *testing.T, k primtest.Kind, name string, holder, adm *clientv3.Client) {
		ctx := etcdtest.Context(t)
		plain := k.First.Make(t, holder, name).(primtest.Doer)
		err := plain.Do(ctx, func(fctx context.Context) error {
			l := plain.(primtest.Locker)
			require.NoError(t, admin.Ask(ctx, adm, name, tokenOf(t, adm, l.Key()), "not heeded"))
			etcdtest.Within(t, l.(asker).Asked(), askWait, "Asked after the ask")
			return fctx.Err()
		})
		require.NoError(t, err, "a Do without WithYieldOnAsk goes on")

		y := k.First.Make(t, holder, name, core.WithYieldOnAsk())
		err = y.(primtest.Doer).Do(ctx, func(fctx context.Context) error {
			require.NoError(t, admin.Ask(ctx, adm, name, tokenOf(t, adm, y.Key()), "let go"))
			etcdtest.Within(t, fctx.Done(), askWait, "fn's ctx after the ask")
			var asked *etcdsync.AskedError
			if assert.ErrorAs(t, context.Cause(fctx), &asked) {
				assert.Equal(t, "let go", asked.Record.Reason)
				assert.Equal(t, y.Key(), asked.Key)
			}
			assert.NoError(t, y.Err(), "an ask is no loss")
			return fctx.Err()
		})
		assert.ErrorIs(t, err, etcdsync.ErrAsked)
		assert.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, etcdsync.ErrLost)
		assert.Zero(t, etcdtest.CountKeys(t, adm, k.Keys(name)), "released")
		assert.Zero(t, askRecords(t, adm, name), "the records went with the releases")
	})
}

// TestAskRefusesBadInputAndWritesNothing: a token below 1, no reason, a reason over 1 KiB,
// a bad name: ErrInvalidOption or ErrInvalidName, and nothing written.
func TestAskRefusesBadInputAndWritesNothing(t *testing.T) {
	ctx := etcdtest.Context(t)
	adm := etcdtest.SpreadClient(t, cluster, 0)
	m := primtest.OpenMutex.Make(t, etcdtest.SpreadClient(t, cluster, 1), "ask-bad")
	require.NoError(t, m.Lock(ctx))
	token := tokenOf(t, adm, m.Key())
	for _, c := range []struct {
		name   string
		token  int64
		reason string
		want   error
	}{
		{"ask-bad", 0, "why", etcdsync.ErrInvalidOption},
		{"ask-bad", -1, "why", etcdsync.ErrInvalidOption},
		{"ask-bad", token, "", etcdsync.ErrInvalidOption},
		{"ask-bad", token, strings.Repeat("x", 1025), etcdsync.ErrInvalidOption},
		{"", token, "why", etcdsync.ErrInvalidName},
		{"a\x00b", token, "why", etcdsync.ErrInvalidName},
	} {
		assert.ErrorIs(t, admin.Ask(ctx, adm, c.name, c.token, c.reason), c.want, "%q %d %q", c.name, c.token, c.reason)
	}
	assert.Zero(t, askRecords(t, adm, "ask-bad"))
	require.NoError(t, m.Unlock(ctx))
}
