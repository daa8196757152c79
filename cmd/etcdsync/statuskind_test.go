//go:build unix

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/admin"
)

// TestCandidateValues: a key directly under a name is a candidate's when its value is one
// that no lock writes, or it lies under "p<N>/"; a lock writes nothing or its owner.
func TestCandidateValues(t *testing.T) {
	for _, tc := range []struct {
		rest, value string
		candidate   bool
	}{
		{"694d_0", "", false}, // etcd's concurrency.Mutex, etcdctl lock
		{"694d_0", "host=web-3 pid=4711 since=2026-11-24T02:30:00Z", false},            // etcdsync's mutex
		{"694d_0", "host=web-3 pid=4711 since=2026-11-24T02:30:00Z owner=5b0e", false}, // reentrant
		{"694d_0", "host=web-4", false},
		{"694d_0", "host=web-3 pid=4711 since=2026-11-24T02:30:00Z role=candidate", true}, // elect's default
		{"694d_0", "web-7:8080", true},                                                    // etcdctl elect's proposal
		{"694d_0", "a value with spaces", true},                                           // a Go program's value
		{"p2/694d_0", "host=web-3 pid=1 since=T", true},                                   // elect --prefer 2
		{"694d", "leader-1", true},                                                        // etcd's concurrency.Election
		{"pending/694d", "host=web-3", false},                                             // no preference: "pending" is no p<N>
	} {
		assert.Equal(t, tc.candidate, isCandidate(tc.rest, tc.value), "%q %q", tc.rest, tc.value)
	}
}

// TestTellElectionsLeavesTheSnapshot: a name with a candidate's key is shown as an election
// (candidates, the holder leads), a lock's name as it was, and the snapshot given is left
// unchanged, for admin.Watch to compare the next one with.
func TestTellElectionsLeavesTheSnapshot(t *testing.T) {
	snap := &admin.Snapshot{Names: []admin.NameStatus{
		{Name: "e", Prefix: "e/", Primitive: admin.KindLock, Queue: []admin.Entry{
			{Kind: admin.KindLock, State: admin.StateHolds, Key: "e/1_0", Value: "web-7:8080"},
			{Kind: admin.KindLock, State: admin.StateWaits, Key: "e/2_0", Value: ""},
		}},
		{Name: "l", Prefix: "l/", Primitive: admin.KindLock, Queue: []admin.Entry{
			{Kind: admin.KindLock, State: admin.StateHolds, Key: "l/1_0", Value: "host=h pid=1 since=T"},
		}},
	}}
	told := tellElections(snap)
	require.Len(t, told.Names, 2)
	assert.Equal(t, "election", told.Names[0].Primitive)
	assert.Equal(t, []string{admin.KindCandidate, admin.KindCandidate}, []string{told.Names[0].Queue[0].Kind, told.Names[0].Queue[1].Kind})
	assert.Equal(t, []string{admin.StateLeads, admin.StateWaits}, []string{told.Names[0].Queue[0].State, told.Names[0].Queue[1].State})
	assert.Equal(t, admin.KindLock, told.Names[1].Primitive)

	assert.Equal(t, admin.KindLock, snap.Names[0].Primitive, "the snapshot given changed")
	assert.Equal(t, admin.KindLock, snap.Names[0].Queue[0].Kind, "the snapshot given changed")
	assert.Equal(t, admin.StateHolds, snap.Names[0].Queue[0].State, "the snapshot given changed")
}
