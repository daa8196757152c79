package faulttest

import (
	"fmt"
	"math"
	"slices"

	"github.com/anishathalye/porcupine"
)

// maxSlots bounds Workload.Slots, so that the model's state is a comparable value.
const maxSlots = 8

// lockState is the model's state: the tokens holding (ascending, zero-padded), the
// highest token ever granted and the register's value.
type lockState struct {
	holders [maxSlots]int64
	n       int
	top     int64
	value   int64
}

func (s lockState) holds(token int64) bool { return slices.Contains(s.holders[:s.n], token) }

func (s lockState) without(token int64) lockState {
	i := slices.Index(s.holders[:s.n], token)
	if i < 0 {
		return s
	}
	copy(s.holders[i:], s.holders[i+1:s.n])
	s.n--
	s.holders[s.n] = 0
	return s
}

func (s lockState) with(token int64) lockState {
	s.holders[s.n] = token
	s.n++
	slices.Sort(s.holders[:s.n])
	s.top = max(s.top, token)
	return s
}

// modelInput is what an operation asked; its output is its Outcome.
type modelInput struct {
	kind  OpKind
	token int64
	read  int64
}

// lockModel specifies a lock with slots holders at a time guarding a fenced register.
//
//   - An acquire of token T adds T to the holders; with one slot T must exceed every token
//     granted before (the queue is FIFO by create revision). A holder beyond the slots is
//     evicted, any of them: its hold was lost (lease expired, revoked) without anyone
//     seeing it yet. Eviction is the model's only non-determinism.
//   - A fenced write by T is accepted only while T holds and, with one slot, only if the
//     register still has the value T read under its hold (two holders at once would
//     overwrite each other); it increments the register. Refused, T is no longer a holder.
//   - A release by T that succeeded requires T to hold; one that found the hold lost, or
//     whose outcome is unknown, leaves T no longer a holder.
//
// Ambiguous writes are resolved before checking (their marker key tells whether they
// landed): those that landed are accepted writes that may take effect until the end of time.
func lockModel(slots int) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{lockState{}} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(lockState), input.(modelInput), output.(Outcome)
			if next, ok := step(s, in, out, slots); ok {
				return next
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in := input.(modelInput)
			if in.kind == Write {
				return fmt.Sprintf("write by %d, read %d -> %v", in.token, in.read, output)
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
func step(s lockState, in modelInput, out Outcome, slots int) ([]any, bool) {
	switch in.kind {
	case Acquire:
		if s.holds(in.token) || (slots == 1 && in.token <= s.top) {
			return nil, false
		}
		if s.n < slots {
			return []any{s.with(in.token)}, true
		}
		next := make([]any, 0, s.n)
		for _, evicted := range s.holders[:s.n] {
			next = append(next, s.without(evicted).with(in.token))
		}
		return next, true
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
			Input:    modelInput{kind: op.Kind, token: op.Token, read: op.Read},
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
