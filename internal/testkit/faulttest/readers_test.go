package faulttest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Readers are workers 4 and 5 here, writers 0 and 1, as in a run.
func TestReadWriteOverlap(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		ops     []Op
		overlap bool
	}{{
		desc: "a read hold inside a write hold", overlap: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1),
			at(4, ReadAcquire, 0, OK, 2, 3), at(4, ReadRelease, 0, OK, 4, 5),
			at(0, Release, 10, OK, 6, 7),
		},
	}, {
		desc: "a write hold inside a read hold", overlap: true,
		ops: []Op{
			at(4, ReadAcquire, 0, OK, 0, 1),
			at(0, Acquire, 10, OK, 2, 3), at(0, Release, 10, OK, 4, 5),
			at(4, ReadRelease, 0, OK, 6, 7),
		},
	}, {
		desc: "a read hold across a hand-off between writers", overlap: true,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), at(4, ReadAcquire, 0, OK, 2, 3), at(0, Release, 10, OK, 4, 5),
			at(1, Acquire, 20, OK, 4, 6), at(4, ReadRelease, 0, OK, 7, 8), at(1, Release, 20, OK, 9, 10),
		},
	}, {
		desc: "reads overlap each other only", overlap: false,
		ops: []Op{
			at(4, ReadAcquire, 0, OK, 0, 1), at(5, ReadAcquire, 0, OK, 0, 2),
			at(4, ReadRelease, 0, OK, 3, 4), at(5, ReadRelease, 0, OK, 5, 6),
			at(0, Acquire, 10, OK, 0, 7), at(0, Release, 10, OK, 8, 9),
			at(4, ReadAcquire, 0, OK, 8, 10), at(5, ReadAcquire, 0, OK, 9, 11),
			at(5, ReadRelease, 0, OK, 12, 13), at(4, ReadRelease, 0, OK, 14, 15),
		},
	}, {
		// The write lock may be granted while the read release is in flight, and the next
		// read may be granted while the write release is: the holds meet, they do not overlap.
		desc: "holds that meet at a release's call", overlap: false,
		ops: []Op{
			at(4, ReadAcquire, 0, OK, 0, 1), at(0, Acquire, 10, OK, 0, 2), at(4, ReadRelease, 0, OK, 2, 3),
			at(4, ReadAcquire, 0, OK, 3, 4), at(0, Release, 10, OK, 4, 5), at(4, ReadRelease, 0, OK, 6, 7),
		},
	}, {
		desc: "a lost read hold under a later writer", overlap: false,
		ops: []Op{
			at(4, ReadAcquire, 0, OK, 0, 1), at(0, Acquire, 10, OK, 0, 2),
			at(0, Release, 10, OK, 3, 4), at(4, ReadRelease, 0, Refused, 5, 6),
		},
	}, {
		desc: "a lost write hold under a later reader", overlap: false,
		ops: []Op{
			at(0, Acquire, 10, OK, 0, 1), at(4, ReadAcquire, 0, OK, 0, 2),
			at(4, ReadRelease, 0, OK, 3, 4), at(0, Release, 10, Refused, 5, 6),
		},
	}, {
		desc: "a read release of unknown outcome", overlap: false,
		ops: []Op{
			at(4, ReadAcquire, 0, OK, 0, 1), at(0, Acquire, 10, OK, 0, 2),
			at(0, Release, 10, OK, 3, 4), at(4, ReadRelease, 0, Ambiguous, 5, 6),
		},
	}} {
		t.Run(tc.desc, func(t *testing.T) {
			v := readWriteViolations(tc.ops)
			assert.Equal(t, tc.overlap, len(v) > 0, "read/write overlap: %v", v)
			if tc.overlap {
				assert.Contains(t, v[0], "read hold released cleanly overlaps")
			}
			assert.Empty(t, exclusionViolations(tc.ops, 1), "read holds are not write holds")
		})
	}
}

// TestReadsAreLeftOutOfTheModel checks that a history with read holds beside a hand-off
// between writers linearizes, and that the summary counts the read holds.
func TestReadsAreLeftOutOfTheModel(t *testing.T) {
	ops := []Op{
		at(4, ReadAcquire, 0, OK, 0, 1), at(5, ReadAcquire, 0, OK, 0, 2),
		at(4, ReadRelease, 0, OK, 3, 4), at(5, ReadRelease, 0, Refused, 3, 5),
		at(0, Acquire, 10, OK, 0, 6), write(0, 10, 1, 0, OK, 7, 8), at(0, Release, 10, OK, 9, 10),
		at(4, ReadAcquire, 0, OK, 10, 11), at(4, ReadRelease, 0, Ambiguous, 12, 13),
		at(1, Acquire, 20, OK, 7, 14), write(1, 20, 2, 1, OK, 15, 16), at(1, Release, 20, OK, 17, 18),
	}
	landed := map[int64]bool{1: true, 2: true}
	assert.Empty(t, linearizability(ops, landed, 1, 4, false, t.TempDir()))
	assert.Equal(t, "2 acquires; writes: 2 accepted, 0 refused, 0 ambiguous (0 landed); releases: 2 ok, 0 lost, 0 ambiguous; "+
		"3 read holds; read releases: 1 ok, 1 lost, 1 ambiguous", summarize(ops, landed))
	assert.Equal(t, "[12ms, 13ms] worker 4 read-release -> ambiguous", ops[8].String())
}
