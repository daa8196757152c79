package core

import (
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A double barrier's participants are keys "<name>/in/<lease hex>_<slot>" on their
// sessions' leases, as a queue's; a crashed participant's key goes with its lease. The
// name's rounds are slices of their create revisions: a round is the first n participants
// created after the previous round's cutoff, and its cutoff is the create revision of its
// n-th. The record "<name>/round" (no lease) says the current round's number and the
// cutoffs of the rounds before, newest first ("<round> <cutoff> <cutoff> ..."; absent: round
// 1); "<name>/size" (no lease) says n, which every participant's put compares (Spec.Guard).
//
// How participants enter and leave by them: package barrier (double.go).

// roundHistory is how many cutoffs the round record keeps: a participant that learns its
// round only after more rounds than that filled cannot tell where its round began.
const roundHistory = 64

// MaxParticipants is the largest n a double barrier takes.
const MaxParticipants = 100_000

// Rounds is what a double barrier's round record says.
type Rounds struct {
	n    int64   // the current round's number, from 1
	cuts []int64 // the cutoffs of the rounds before it, newest first
}

// ParseRounds reads the round record, kvs (zero or one key): absent, the first round.
func ParseRounds(kvs []*mvccpb.KeyValue) (Rounds, error) {
	if len(kvs) == 0 {
		return Rounds{n: 1}, nil
	}
	fields := strings.Fields(string(kvs[0].Value))
	var r Rounds
	for i, f := range fields {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v < 1 || (i > 1 && v >= r.cuts[i-2]) {
			return r, fmt.Errorf("round record %s holds %q, not a round and its cutoffs", kvs[0].Key, kvs[0].Value)
		}
		if i == 0 {
			r.n = v
		} else {
			r.cuts = append(r.cuts, v)
		}
	}
	if r.n == 0 || int64(len(r.cuts)) > r.n-1 {
		return r, fmt.Errorf("round record %s holds %q, not a round and its cutoffs", kvs[0].Key, kvs[0].Value)
	}
	return r, nil
}

func (r Rounds) String() string {
	var s strings.Builder
	s.WriteString(strconv.FormatInt(r.n, 10))
	for _, c := range r.cuts {
		s.WriteString(" " + strconv.FormatInt(c, 10))
	}
	return s.String()
}

// Filled is r after the current round filled at cutoff.
func (r Rounds) Filled(cutoff int64) Rounds {
	cuts := append([]int64{cutoff}, r.cuts[:min(len(r.cuts), roundHistory-1)]...)
	return Rounds{n: r.n + 1, cuts: cuts}
}

// last is the cutoff of the last round filled; 0 before the first.
func (r Rounds) last() int64 {
	if len(r.cuts) == 0 {
		return 0
	}
	return r.cuts[0]
}

// Place is where a participant created at revision x is: in a round filled (member), its
// number and the participants created after lo through hi; else in the current round,
// after lo.
func (r Rounds) Place(x int64) (lo, hi, round int64, member bool, err error) {
	if x > r.last() {
		return r.last(), 0, r.n, false, nil
	}
	for i, c := range r.cuts {
		round := r.n - 1 - int64(i)
		switch {
		case i+1 < len(r.cuts) && x <= r.cuts[i+1]:
			continue
		case i+1 < len(r.cuts):
			return r.cuts[i+1], c, round, true, nil
		case round == 1: // the first round of all
			return 0, c, round, true, nil
		}
	}
	return 0, 0, 0, false, fmt.Errorf("%w: the barrier filled more than %d rounds before this participant learned its own", ErrLost, roundHistory)
}

// BarrierPlace is what a barrier's round record (zero or one key) says: the current
// round's number, and, for the participant whose key was created at token, whether it is a
// member of a round filled, and which.
func BarrierPlace(record []*mvccpb.KeyValue, token int64) (current, round int64, member bool, err error) {
	r, err := ParseRounds(record)
	if err != nil {
		return 0, 0, false, err
	}
	_, _, round, member, err = r.Place(token)
	return r.n, round, member, err
}
