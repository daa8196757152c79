package core_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/etcdsync/etcdsync/internal/core"
)

// TestServedFollowsTheRuleEveryWaiterWaitsOn: who holds, as the command's status and the
// semaphore's InUse decide it, is the rule the queue serves by: the first key of a mutex or
// election; readers up to the first writer, and a writer only first; permits while their
// units fit the limit beside those ahead, a heavy waiter holding back the lighter ones behind
// it; a record is neither served nor counted. A reader passes a write key in read mode and
// an upgradable read, and an upgrading one only if the reader came before its change.
func TestServedFollowsTheRuleEveryWaiterWaitsOn(t *testing.T) {
	const prefix = "n/"
	spec := func(rel, mode string) (core.Spec, bool) {
		switch {
		case rel == core.RecordLimit:
			return core.Spec{}, false
		case strings.HasPrefix(rel, core.KindRead):
			return core.Spec{Kind: core.KindRead, Ahead: core.KindWrite, Passes: []string{core.ModeRead, core.ModeUpgradable}}, true
		case strings.HasPrefix(rel, core.KindWrite) && (mode == core.ModeUpgradable || mode == core.ModeUpgrading):
			return core.Spec{Kind: core.KindWrite, Ahead: core.KindWrite, Passes: []string{core.ModeRead}}, true
		case strings.HasPrefix(rel, core.KindWrite):
			return core.Spec{Kind: core.KindWrite}, true
		case strings.HasPrefix(rel, core.KindPermit):
			return core.Spec{Kind: core.KindPermit, Ahead: core.KindPermit, Capacity: 4,
				Weight: core.KeyUnits(prefix+core.KindPermit, prefix+rel)}, true
		}
		return core.Spec{}, true
	}
	for _, tc := range []struct {
		name string
		keys []string
		want []bool
	}{
		{"mutex", []string{"a_0", "b_0", "c_0"}, []bool{true, false, false}},
		{"readers then a writer", []string{"read/a_0", "read/b_0", "write/c_0", "read/d_0"}, []bool{true, true, false, false}},
		{"a writer first", []string{"write/a_0", "read/b_0"}, []bool{true, false}},
		{"permits", []string{"limit", "permit/a_0", "permit/u2/b_0", "permit/u2/c_0", "permit/d_0"}, []bool{false, true, true, false, false}},
		{"a heavy waiter holds back lighter ones", []string{"permit/u3/a_0", "permit/u2/b_0", "permit/c_0"}, []bool{true, false, false}},
		// A key "k mode@m" is in mode, written at revision m; keys are created at 1, 2, ...
		{"a downgraded writer", []string{"write/a_0 read@5", "read/b_0", "write/c_0", "read/d_0"}, []bool{true, true, false, false}},
		{"an upgradable read", []string{"read/a_0", "write/b_0 upgradable@2", "read/c_0", "write/d_0 upgradable@4", "write/e_0"}, []bool{true, true, true, false, false}},
		{"an upgrading read", []string{"read/a_0", "write/b_0 upgrading@4", "read/c_0", "read/e_0"}, []bool{true, true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := make([]core.QueuedKey, len(tc.keys))
			for i, k := range tc.keys {
				key, mode, _ := strings.Cut(k, " ")
				mode, at, _ := strings.Cut(mode, "@")
				modRev, _ := strconv.ParseInt(at, 10, 64)
				keys[i] = core.QueuedKey{Key: prefix + key, Created: int64(i + 1), ModRev: max(modRev, int64(i+1)), Mode: mode}
			}
			assert.Equal(t, tc.want, core.Served(prefix, keys, spec))
		})
	}
}
