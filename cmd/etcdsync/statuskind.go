//go:build unix

package main

import (
	"slices"
	"strings"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/etcdsync/etcdsync/internal/core"
)

// candidateField marks the default value of `etcdsync elect` ("host=H pid=P since=T
// role=candidate") as a candidate's, so that status tells its election from a lock.
const candidateField = "role=candidate"

// The keys directly under a name are a lock's or an election's candidates, and etcd's keys
// cannot tell which: both are "NAME/<lease hex>[_<slot>]", served first come first served
// (admin.Status calls them lock unless told, admin.Elections). Their values can: a lock
// writes nothing (etcd's concurrency.Mutex, etcdctl lock) or its owner (etcdsync's mutex and
// reentrant: host=, pid=, since=, owner= fields), while a candidate writes its value, what
// observers see of the leader (etcdctl elect's proposal, Campaign's value, elect's --value),
// and etcdsync elect's default owner carries candidateField. A candidate with a preference
// (elect --prefer) has its key under "p<N>/", which no lock writes.
var lockFields = map[string]bool{"host": true, "pid": true, "since": true, "owner": true}

// isCandidate reports whether the key rest (after its name's prefix) with value can only be
// an election candidate's.
func isCandidate(rest, value string) bool {
	if _, _, ok := core.CutPreference(rest); ok {
		return true
	}
	for f := range strings.FieldsSeq(value) {
		if k, _, ok := strings.Cut(f, "="); !ok || !lockFields[k] {
			return true // a field that no lock writes: a candidate's value
		}
	}
	return false
}

// tellElections is snap with each name whose keys admin read as a lock's shown as an
// election, when a key of it can only be a candidate's: its primitive election, its keys
// candidates, and the one that holds leads. admin.Elections would show the same: lock and
// candidate keys are served by the same rule. snap itself is left as it is (admin.Watch
// compares the next snapshot with it).
func tellElections(snap *admin.Snapshot) *admin.Snapshot {
	told := *snap
	told.Names = slices.Clone(snap.Names)
	for i := range told.Names {
		ns := &told.Names[i]
		if ns.Primitive != admin.KindLock || !hasCandidate(ns) {
			continue
		}
		ns.Primitive = "election"
		ns.Queue = slices.Clone(ns.Queue)
		for j := range ns.Queue {
			e := &ns.Queue[j]
			if e.Kind != admin.KindLock {
				continue
			}
			e.Kind = admin.KindCandidate
			if e.State == admin.StateHolds {
				e.State = admin.StateLeads
			}
		}
	}
	return &told
}

// hasCandidate reports whether a key of ns can only be an election candidate's.
func hasCandidate(ns *admin.NameStatus) bool {
	for _, e := range ns.Queue {
		if e.Kind == admin.KindLock && isCandidate(strings.TrimPrefix(e.Key, ns.Prefix), e.Value) {
			return true
		}
	}
	return false
}
