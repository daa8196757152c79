package admin

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/goleak"

	"github.com/etcdsync/etcdsync/internal/core"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOwnerFields: the owner is the value's key=value fields when it has a host, pid or
// since; anything else names no owner.
func TestOwnerFields(t *testing.T) {
	for value, want := range map[string]map[string]string{
		"host=web-3 pid=4711 since=2026-11-24T07:00:00Z": {"host": "web-3", "pid": "4711", "since": "2026-11-24T07:00:00Z"},
		"host=H pid=P owner=abc":                         {"host": "H", "pid": "P", "owner": "abc"},
		"pid=12":                                         {"pid": "12"},
		"  since=x   extra words ":                       {"since": "x"},
		"":                                               nil,
		"leader-1":                                       nil,
		"owner=abc url=http://x/?a=b":                    nil,
	} {
		assert.Equal(t, want, parseOwner(value), "%q", value)
	}
}

// TestNamesRoundTrip: status shows the name whose escaped form a key holds.
func TestNamesRoundTrip(t *testing.T) {
	for _, name := range []string{"a", "a/b", "a%2Fb", "%", "100%/x", "ü/%25"} {
		assert.Equal(t, name, core.UnescapeName(strings.TrimSuffix(core.NamePrefix(name), "/")))
	}
}

// TestSyncKeyShape: status without NAME takes a key for a holder's or waiter's by what
// follows its name: the layouts of etcdsync, etcd's concurrency package, etcdctl and etcd's
// recipes, and a semaphore's limit record; not application data.
func TestSyncKeyShape(t *testing.T) {
	for rest, want := range map[string]bool{
		"694d9a6f23c1b705":          true, // concurrency.Mutex, Election, etcdctl lock and elect
		"694d9a6f23c1b705_0":        true, // etcdsync
		"read/694d9a6f23c1b705_1":   true,
		"write/694d9a6f23c1b705_12": true,
		"read/1732518400123456789":  true, // recipe.RWMutex
		"permit/694d9a6f23c1b705_0": true,
		"permit/u3/694d9a6f23c1_0":  true,
		"limit":                     true,
		"":                          false,
		"config":                    false,
		"694D9A":                    false,
		"694d9a_":                   false,
		"694d9a_x":                  false,
		"a/694d9a":                  false, // a name under another prefix
		"read/":                     false,
		"permit/u3/":                false,
		"permit/ux/694d9a_0":        false,
		"limits":                    false,
	} {
		assert.Equal(t, want, syncKeyShape(rest), "%q", rest)
	}
}

// TestWhoHoldsFollowsThePrimitivesRules: an exclusive key holds when first; a read key when
// no write key is ahead; a permit when fewer than the limit are ahead; a limit record is the
// limit, not a holder.
func TestWhoHoldsFollowsThePrimitivesRules(t *testing.T) {
	kvs := func(keys ...string) []*mvccpb.KeyValue {
		var out []*mvccpb.KeyValue
		for i, k := range keys {
			kv := &mvccpb.KeyValue{Key: []byte("n/" + k), CreateRevision: int64(10 + i), Lease: 0x1f}
			if k == core.RecordLimit {
				kv.Value, kv.Lease = []byte("2"), 0
			}
			out = append(out, kv)
		}
		return out
	}
	states := func(ns NameStatus) string {
		var s []string
		for _, e := range ns.Queue {
			s = append(s, fmt.Sprintf("%d:%s:%s", e.Position, e.Kind, e.State))
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		keys      []string
		exclusive string
		primitive string
		want      string
	}{
		{[]string{"a", "b", "c"}, KindLock, "lock", "1:lock:holds 2:lock:waits 3:lock:waits"},
		{[]string{"a", "b"}, KindCandidate, "election", "1:candidate:leads 2:candidate:waits"},
		{[]string{"read/a", "read/b", "write/c", "read/d", "write/e"}, KindLock, "rwmutex",
			"1:read:holds 2:read:holds 3:write:waits 4:read:waits 5:write:waits"},
		{[]string{"write/a", "read/b"}, KindLock, "rwmutex", "1:write:holds 2:read:waits"},
		{[]string{"limit", "permit/a", "permit/b", "permit/c"}, KindLock, "semaphore",
			"1:permit:holds 2:permit:holds 3:permit:waits"},
		{[]string{"permit/a"}, KindLock, "semaphore", "1:permit:unknown"},
		{[]string{"limit"}, KindLock, "semaphore", ""},
		{nil, KindLock, "", ""},
	} {
		ns := queueOf("n", "n/", kvs(tc.keys...), tc.exclusive)
		assert.Equal(t, tc.primitive, ns.Primitive, "%q", tc.keys)
		assert.Equal(t, tc.want, states(ns), "%q", tc.keys)
		for _, e := range ns.Queue {
			assert.Equal(t, "1f", e.Lease)
		}
	}
}
