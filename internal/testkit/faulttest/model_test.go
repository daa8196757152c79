package faulttest

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// at builds an op from call to ret, in milliseconds.
func at(worker int, kind OpKind, token int64, out Outcome, call, ret int) Op {
	return Op{Worker: worker, Kind: kind, Token: token, Outcome: out,
		Call: time.Duration(call) * time.Millisecond, Return: time.Duration(ret) * time.Millisecond}
}

// units makes an acquire take n slots.
func units(op Op, n int) Op {
	op.Units = n
	return op
}

func write(worker int, token, id, read int64, out Outcome, call, ret int) Op {
	op := at(worker, Write, token, out, call, ret)
	op.WriteID, op.Read = id, read
	return op
}

func TestModel(t *testing.T) {
	for _, tc := range []struct {
		desc       string
		slots      int
		ops        []Op
		landed     map[int64]bool
		value      int64
		counted    bool // the register counts the writes that landed
		exclusive  bool // no overlap between holds released cleanly
		linearizes bool
		handsOver  bool // Workload.HandsOver
	}{{
		desc: "hand-off", slots: 1, value: 2, counted: true, exclusive: true, linearizes: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), write(0, 10, 1, 0, OK, 2, 3), at(0, Release, 10, OK, 4, 5),
			at(1, Acquire, 20, OK, 3, 6), write(1, 20, 2, 1, OK, 7, 8), at(1, Release, 20, OK, 9, 10),
		},
		landed: map[int64]bool{1: true, 2: true},
	}, {
		// A transfer: the leader's release and the candidate's acquire of the same token
		// overlap (the candidate's Campaign returns once it accepted, within the Yield).
		desc: "a handover", slots: 1, value: 2, counted: true, exclusive: true, linearizes: true, handsOver: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), write(0, 10, 1, 0, OK, 2, 3), at(0, Release, 10, OK, 4, 6),
			at(1, Acquire, 10, OK, 3, 5), write(1, 10, 2, 1, OK, 7, 8), at(1, Release, 10, OK, 9, 10),
		},
		landed: map[int64]bool{1: true, 2: true},
	}, {
		desc: "a token granted twice, where no hold hands over", slots: 1, value: 2, counted: true, exclusive: true, linearizes: false,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), write(0, 10, 1, 0, OK, 2, 3), at(0, Release, 10, OK, 4, 6),
			at(1, Acquire, 10, OK, 3, 5), write(1, 10, 2, 1, OK, 7, 8), at(1, Release, 10, OK, 9, 10),
		},
		landed: map[int64]bool{1: true, 2: true},
	}, {
		desc: "a handover while the leader still holds", slots: 1, value: 1, counted: true, exclusive: false, linearizes: false, handsOver: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), at(1, Acquire, 10, OK, 2, 3), write(0, 10, 1, 0, OK, 4, 5), at(0, Release, 10, OK, 6, 7),
			at(1, Release, 10, OK, 8, 9),
		},
		landed: map[int64]bool{1: true},
	}, {
		desc: "an older token after a handover", slots: 1, counted: true, exclusive: true, linearizes: false, handsOver: true,
		ops: []Op{
			at(0, Acquire, 20, OK, 0, 1), at(0, Release, 20, OK, 2, 3), at(1, Acquire, 10, OK, 4, 5), at(1, Release, 10, OK, 6, 7),
		},
	}, {
		desc: "two holders released cleanly overlap", slots: 1, counted: true, exclusive: false, linearizes: false,
		ops: []Op{at(0, Acquire, 10, OK, 0, 1), at(1, Acquire, 20, OK, 0, 2), at(0, Release, 10, OK, 3, 4), at(1, Release, 20, OK, 5, 6)},
	}, {
		desc: "a holder taken over writes", slots: 1, value: 1, counted: true, exclusive: true, linearizes: false,
		ops:    []Op{at(0, Acquire, 10, OK, 0, 1), at(1, Acquire, 20, OK, 0, 2), write(0, 10, 1, 0, OK, 3, 4), at(0, Release, 10, Refused, 5, 6)},
		landed: map[int64]bool{1: true},
	}, {
		desc: "a holder taken over is refused", slots: 1, counted: true, exclusive: true, linearizes: true,
		ops: []Op{at(0, Acquire, 10, OK, 0, 1), at(1, Acquire, 20, OK, 0, 2), write(0, 10, 1, 0, Refused, 3, 4), at(0, Release, 10, Refused, 5, 6)},
	}, {
		desc: "lost update", slots: 1, value: 1, counted: false, exclusive: true, linearizes: false,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), write(0, 10, 1, 0, OK, 2, 3), at(0, Release, 10, OK, 4, 5),
			at(1, Acquire, 20, OK, 6, 7), write(1, 20, 2, 0, OK, 8, 9), at(1, Release, 20, OK, 10, 11),
		},
		landed: map[int64]bool{1: true, 2: true},
	}, {
		desc: "token goes back", slots: 1, counted: true, exclusive: true, linearizes: false,
		ops: []Op{at(0, Acquire, 20, OK, 0, 1), at(0, Release, 20, OK, 2, 3), at(1, Acquire, 10, OK, 4, 5), at(1, Release, 10, OK, 6, 7)},
	}, {
		desc: "ambiguous write that landed", slots: 1, value: 2, counted: true, exclusive: true, linearizes: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), write(0, 10, 1, 0, Ambiguous, 2, 3), at(0, Release, 10, Refused, 4, 5),
			at(1, Acquire, 20, OK, 6, 7), write(1, 20, 2, 1, OK, 8, 9), at(1, Release, 20, OK, 10, 11),
		},
		landed: map[int64]bool{1: true, 2: true},
	}, {
		desc: "ambiguous write that did not land", slots: 1, value: 1, counted: true, exclusive: true, linearizes: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), write(0, 10, 1, 0, Ambiguous, 2, 3), at(0, Release, 10, Ambiguous, 4, 5),
			at(1, Acquire, 20, OK, 6, 7), write(1, 20, 2, 0, OK, 8, 9), at(1, Release, 20, OK, 10, 11),
		},
		landed: map[int64]bool{2: true},
	}, {
		desc: "two slots held at once", slots: 2, counted: true, exclusive: true, linearizes: true,
		ops: []Op{at(0, Acquire, 10, OK, 0, 1), at(1, Acquire, 20, OK, 0, 2), at(0, Release, 10, OK, 3, 4), at(1, Release, 20, OK, 5, 6)},
	}, {
		desc: "three holders in two slots", slots: 2, counted: true, exclusive: false, linearizes: false,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), at(1, Acquire, 20, OK, 0, 2), at(2, Acquire, 30, OK, 0, 3),
			at(0, Release, 10, OK, 4, 5), at(1, Release, 20, OK, 4, 6), at(2, Release, 30, OK, 4, 7),
		},
	}, {
		desc: "units that fit beside each other", slots: 4, counted: true, exclusive: true, linearizes: true,
		ops: []Op{
			units(at(0, Acquire, 10, OK, 0, 1), 3), at(1, Acquire, 20, OK, 0, 2),
			at(0, Release, 10, OK, 3, 4), at(1, Release, 20, OK, 5, 6),
		},
	}, {
		desc: "units past the limit, released cleanly", slots: 4, counted: true, exclusive: false, linearizes: false,
		ops: []Op{
			units(at(0, Acquire, 10, OK, 0, 1), 3), units(at(1, Acquire, 20, OK, 0, 2), 2),
			at(0, Release, 10, OK, 3, 4), at(1, Release, 20, OK, 5, 6),
		},
	}, {
		desc: "units past the limit, one holder lost", slots: 4, counted: true, exclusive: true, linearizes: true,
		ops: []Op{
			units(at(0, Acquire, 10, OK, 0, 1), 3), units(at(1, Acquire, 20, OK, 0, 2), 2),
			at(0, Release, 10, Refused, 3, 4), at(1, Release, 20, OK, 5, 6),
		},
	}, {
		desc: "a heavy acquire evicts two holders", slots: 4, counted: true, exclusive: true, linearizes: true,
		ops: []Op{
			units(at(0, Acquire, 10, OK, 0, 1), 2), units(at(1, Acquire, 20, OK, 0, 2), 2), units(at(2, Acquire, 30, OK, 3, 4), 4),
			at(0, Release, 10, Refused, 5, 6), at(1, Release, 20, Refused, 5, 7), at(2, Release, 30, OK, 8, 9),
		},
	}, {
		desc: "a heavy acquire cannot leave a holder it needs evicted", slots: 4, counted: true, exclusive: false, linearizes: false,
		ops: []Op{
			units(at(0, Acquire, 10, OK, 0, 1), 2), units(at(1, Acquire, 20, OK, 0, 2), 2), units(at(2, Acquire, 30, OK, 3, 4), 4),
			at(0, Release, 10, Refused, 5, 6), at(1, Release, 20, OK, 5, 7), at(2, Release, 30, OK, 8, 9),
		},
	}} {
		t.Run(tc.desc, func(t *testing.T) {
			reg := registerViolations(tc.ops, tc.landed, tc.value, tc.slots)
			assert.Equal(t, tc.counted, len(reg) == 0, "register: %v", reg)
			excl := exclusionViolations(tc.ops, tc.slots)
			assert.Equal(t, tc.exclusive, len(excl) == 0, "exclusion: %v", excl)
			lin := linearizability(tc.ops, tc.landed, tc.slots, 3, tc.handsOver, t.TempDir())
			assert.Equal(t, tc.linearizes, lin == "", "linearizability: %s", lin)
			if lin != "" {
				assert.Contains(t, lin, "linearizability.html", "visualization written")
			}
		})
	}
}

func TestRegisterViolations(t *testing.T) {
	ops := []Op{write(0, 10, 1, 0, OK, 0, 1), write(0, 10, 2, 1, Refused, 2, 3), write(0, 10, 3, 1, Ambiguous, 4, 5)}
	assert.Empty(t, registerViolations(ops, map[int64]bool{1: true, 3: true}, 2, 1))
	for _, tc := range []struct {
		desc   string
		landed map[int64]bool
		value  int64
		want   string
	}{
		{"accepted without marker", map[int64]bool{3: true}, 1, "accepted write left no marker"},
		{"refused with marker", map[int64]bool{1: true, 2: true}, 2, "refused write left a marker"},
		{"increment lost", map[int64]bool{1: true, 3: true}, 1, "register is 1 after 2 writes landed"},
		{"increment doubled", map[int64]bool{1: true}, 2, "register is 2 after 1 writes landed"},
	} {
		v := strings.Join(registerViolations(ops, tc.landed, tc.value, 1), "\n")
		assert.Contains(t, v, tc.want, tc.desc)
	}
}
