package core

import "testing"

// TestPreferenceKeys: a preference's kind round-trips, only etcdsync's candidate keys take a
// handover (with or without a preference), and no other shape reads as a preference.
func TestPreferenceKeys(t *testing.T) {
	q := &Queue{prefix: "app/leader/"}
	for _, n := range []int{1, 7, MaxPreference} {
		got, after, ok := CutPreference(PreferenceKind(n) + "694d9a6f_0")
		if !ok || got != n || after != "694d9a6f_0" {
			t.Errorf("CutPreference(PreferenceKind(%d)+key) = %d, %q, %v", n, got, after, ok)
		}
	}
	for _, rest := range []string{"694d9a6f_0", "694d9a6f", "p/694d9a6f_0", "p0/x_0", "p01/x_0", "p-1/x_0", "p+1/x_0", "px/x_0", "p1", "read/x_0"} {
		if n, _, ok := CutPreference(rest); ok {
			t.Errorf("CutPreference(%q) = %d: a preference", rest, n)
		}
	}
	for key, want := range map[string]bool{
		"app/leader/694d9a6f_0":      true,  // etcdsync's
		"app/leader/p3/694d9a6f_1":   true,  // etcdsync's, preferred
		"app/leader/694d9a6f":        false, // etcd's concurrency.Election, etcdctl elect
		"app/leader/p3/694d9a6f":     false,
		"app/leader/read/694d9a6f_0": false,
		"app/other/694d9a6f_0":       false,
	} {
		if got := q.HandsOver(key); got != want {
			t.Errorf("handsOver(%q) = %v, want %v", key, got, want)
		}
	}
	if got := TransferRequestKey("app/leader/"); got != "app/leader\x00transfer" {
		t.Errorf("TransferRequestKey = %q", got)
	}
	if got := HandoverRecordKey("app/leader/", "app/leader/694d9a6f_0"); got != "app/leader\x00handover/694d9a6f_0" {
		t.Errorf("HandoverRecordKey = %q", got)
	}
}
