package core

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestRounds: a round record's value is read back as written; a participant's place is the
// round whose slice of create revisions holds its key, or the current round; a value that
// is not a round and its cutoffs, newest first, is refused.
func TestRounds(t *testing.T) {
	record := func(v string) []*mvccpb.KeyValue {
		return []*mvccpb.KeyValue{{Key: []byte("x/round"), Value: []byte(v)}}
	}
	r, err := ParseRounds(nil)
	if err != nil || r.n != 1 || r.String() != "1" {
		t.Fatalf("no record: %v, %v", r, err)
	}
	r = r.Filled(10).Filled(20).Filled(35) // rounds 1 to 3 filled: (0,10], (10,20], (20,35]
	if got := r.String(); got != "4 35 20 10" {
		t.Fatalf("three rounds filled: %q", got)
	}
	back, err := ParseRounds(record(r.String()))
	if err != nil || back.String() != r.String() {
		t.Fatalf("read back: %v, %v", back, err)
	}
	for _, c := range []struct {
		x, lo, hi, round int64
		member           bool
	}{
		{5, 0, 10, 1, true}, {10, 0, 10, 1, true}, {11, 10, 20, 2, true}, {35, 20, 35, 3, true}, {36, 35, 0, 4, false},
	} {
		lo, hi, round, member, err := back.Place(c.x)
		if err != nil || lo != c.lo || hi != c.hi || round != c.round || member != c.member {
			t.Errorf("place(%d) = %d, %d, %d, %v, %v; want %d, %d, %d, %v", c.x, lo, hi, round, member, err, c.lo, c.hi, c.round, c.member)
		}
	}
	// Past roundHistory rounds the oldest cutoffs go: a participant before them cannot tell.
	long := Rounds{n: 1}
	for i := range roundHistory + 5 {
		long = long.Filled(int64(10 * (i + 1)))
	}
	if len(long.cuts) != roundHistory {
		t.Fatalf("%d cutoffs kept", len(long.cuts))
	}
	if _, _, _, _, err := long.Place(5); !errors.Is(err, ErrLost) {
		t.Errorf("a participant older than the history: %v", err)
	}
	if _, hi, round, member, err := long.Place(long.cuts[0]); err != nil || !member || hi != long.cuts[0] || round != long.n-1 {
		t.Errorf("the last round filled: %d, %d, %v, %v", hi, round, member, err)
	}
	for _, bad := range []string{"", "x", "0", "2 10 20", "1 10", "3 20 -1"} {
		if _, err := ParseRounds(record(bad)); err == nil {
			t.Errorf("%q read as a round record", bad)
		}
	}
}
