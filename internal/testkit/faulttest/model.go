package faulttest

import (
	"fmt"
	"math"
	"slices"

	"github.com/anishathalye/porcupine"
)

// maxSlots bounds Workload.Slots, so that the model's state is a comparable value.
const maxSlots = 8

// lockState is the model's state: the tokens holding (ascending, zero-padded) with the
// slots each takes, the slots taken, the highest token ever granted and the register's value.
type lockState struct {
	holders [maxSlots]int64
	units   [maxSlots]int
	n       int
	used    int
	top     int64
	value   int64
}

func (s lockState) holds(token int64) bool { return slices.Contains(s.holders[:s.n], token) }

func (s lockState) without(token int64) lockState {
	i := slices.Index(s.holders[:s.n], token)
	if i < 0 {
		return s
	}
	s.used -= s.units[i]
	copy(s.holders[i:], s.holders[i+1:s.n])
	copy(s.units[i:], s.units[i+1:s.n])
	s.n--
	s.holders[s.n], s.units[s.n] = 0, 0
	return s
}

func (s lockState) with(token int64, units int) lockState {
	i, _ := slices.BinarySearch(s.holders[:s.n], token)
	copy(s.holders[i+1:s.n+1], s.holders[i:s.n])
	copy(s.units[i+1:s.n+1], s.units[i:s.n])
	s.holders[i], s.units[i] = token, units
	s.n++
	s.used += units
	s.top = max(s.top, token)
	return s
}

// evictions are the states in which holders of s were evicted so that units more fit:
// every set of holders that makes room and has none to spare (each of its members is
// needed), each evicted set once.
func (s lockState) evictions(units, slots int) []lockState {
	var out []lockState
	for set := 1; set < 1<<s.n; set++ {
		freed, least := 0, slots+1
		for i := range s.n {
			if set&(1<<i) != 0 {
				freed += s.units[i]
				least = min(least, s.units[i])
			}
		}
		if s.used-freed+units > slots || s.used-freed+least+units <= slots {
			continue // no room, or room without its smallest member
		}
		next := s
		for i := range s.n {
			if set&(1<<i) != 0 {
				next = next.without(s.holders[i])
			}
		}
		out = append(out, next)
	}
	return out
}

// modelInput is what an operation asked; its output is its Outcome.
type modelInput struct {
	kind  OpKind
	token int64
	units int // Acquire: slots the hold takes, at least 1
	read  int64
}

// lockModel specifies a lock with slots holders at a time guarding a fenced register.
//
//   - An acquire of token T adds T to the holders; with one slot T must exceed every token
//     granted before (the queue is FIFO by create revision), or, for a lock that hands its
//     key over (Workload.HandsOver: an election's transfer), be the highest one granted,
//     held by nobody any more: the hold it was handed. When T's units do not fit
//     beside the holders', holders are evicted until they do, any set of them with none to
//     spare: their holds were lost (lease expired, revoked) without anyone seeing it yet.
//     Eviction is the model's only non-determinism.
//   - A fenced write by T is accepted only while T holds and, with one slot, only if the
//     register still has the value T read under its hold (two holders at once would
//     overwrite each other); it increments the register. Refused, T is no longer a holder.
//   - A release by T that succeeded requires T to hold; one that found the hold lost, or
//     whose outcome is unknown, leaves T no longer a holder.
//
// Ambiguous writes are resolved before checking (their marker key tells whether they
// landed): those that landed are accepted writes that may take effect until the end of time.
func lockModel(slots int, handsOver bool) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{lockState{}} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(lockState), input.(modelInput), output.(Outcome)
			if next, ok := step(s, in, out, slots, handsOver); ok {
				return next
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in := input.(modelInput)
			if in.kind == Write {
				return fmt.Sprintf("write by %d, read %d -> %v", in.token, in.read, output)
			}
			if in.kind == Acquire && in.units > 1 {
				return fmt.Sprintf("acquire %d units -> %d", in.units, in.token)
			}
			if in.kind == Acquire {
				return fmt.Sprintf("acquire -> %d", in.token)
			}
			return fmt.Sprintf("release %d -> %v", in.token, output)
		},
		DescribeState: func(state any) string {
			s := state.(lockState)
			return fmt.Sprintf("holders %v, register %d", s.holders[:s.n], s.value)
		},
	}
	return nm.ToModel()
}

// step returns the states s may move to when in ends with out.
func step(s lockState, in modelInput, out Outcome, slots int, handsOver bool) ([]any, bool) {
	switch in.kind {
	case Acquire:
		handed := handsOver && in.token == s.top
		if s.holds(in.token) || (slots == 1 && in.token <= s.top && !handed) {
			return nil, false
		}
		if s.used+in.units <= slots {
			return []any{s.with(in.token, in.units)}, true
		}
		var next []any
		for _, e := range s.evictions(in.units, slots) {
			next = append(next, e.with(in.token, in.units))
		}
		return next, len(next) > 0
	case Write:
		if out != OK {
			return []any{s.without(in.token)}, true
		}
		if !s.holds(in.token) || (slots == 1 && s.value != in.read) {
			return nil, false
		}
		s.value++
		return []any{s}, true
	default: // Release
		if out == OK && !s.holds(in.token) {
			return nil, false
		}
		return []any{s.without(in.token)}, true
	}
}

// operations turns the history into porcupine's, given which writes landed: an ambiguous
// write that landed counts as accepted, one that did not is left out (it had no effect), and
// both it and an ambiguous release may have taken effect at any time after their call.
// Reads are left out: the model has no readers.
func operations(ops []Op, landed map[int64]bool, workers int) []porcupine.Operation {
	var out []porcupine.Operation
	open := 0
	for _, op := range ops {
		if op.Kind.reads() {
			continue
		}
		p := porcupine.Operation{
			ClientId: op.Worker,
			Input:    modelInput{kind: op.Kind, token: op.Token, units: max(op.Units, 1), read: op.Read},
			Call:     int64(op.Call),
			Output:   op.Outcome,
			Return:   int64(op.Return),
			Metadata: op.String(),
		}
		if op.Outcome == Ambiguous {
			if op.Kind == Write {
				if !landed[op.WriteID] {
					continue
				}
				p.Output = OK
			}
			// Its own row in the visualization: it overlaps the worker's later operations.
			p.ClientId, p.Return = workers+open, math.MaxInt64
			open++
		}
		out = append(out, p)
	}
	return out
}
