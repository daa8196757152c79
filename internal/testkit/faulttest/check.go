package faulttest

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// linearizeTimeout bounds porcupine's search; a history it cannot decide in time is reported.
const linearizeTimeout = time.Minute

// Check verifies the run's invariants once Stop has returned (Verify), failing t with a
// summary of each violation; porcupine's visualization of a history that is not
// linearizable goes to t's artifact directory (kept with go test -artifacts).
func (r *Run) Check(t *testing.T) {
	t.Helper()
	summary, violations, err := r.Verify(t.ArtifactDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Log(summary)
	for _, v := range violations {
		t.Error(v)
	}
}

// Verify checks, once Stop has returned, the register against the writes, exclusion between
// holds released cleanly (read holds included: they may overlap only one another), that
// every hold found gone was told (see awaitTold),
// linearizability of the history (read holds left out) and that no key is left under the
// lock's prefix. It returns a summary of the history and the violations found; err means
// it could not read what it checks. A visualization of a history that is not linearizable
// is written to dir.
func (r *Run) Verify(dir string) (summary string, violations []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ops := r.hist.Ops()
	markers, err := r.env.Admin.Get(ctx, r.data+"marker/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return "", nil, fmt.Errorf("faulttest: read the markers: %w", err)
	}
	landed := map[int64]bool{}
	for _, kv := range markers.Kvs {
		id, err := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), r.data+"marker/"), 10, 64)
		if err != nil {
			return "", nil, fmt.Errorf("faulttest: marker %q: %w", kv.Key, err)
		}
		landed[id] = true
	}
	register, err := r.env.Admin.Get(ctx, r.counter)
	if err != nil {
		return "", nil, fmt.Errorf("faulttest: read the register: %w", err)
	}
	var value int64
	if len(register.Kvs) == 1 {
		value, _ = strconv.ParseInt(string(register.Kvs[0].Value), 10, 64)
	}
	violations = append(violations, registerViolations(ops, landed, value, r.w.slots())...)
	violations = append(violations, exclusionViolations(ops, r.w.slots())...)
	violations = append(violations, readWriteViolations(ops)...)
	r.untoldMu.Lock()
	violations = append(violations, r.untold...)
	r.untoldMu.Unlock()
	if v := linearizability(ops, landed, r.w.slots(), len(r.workers), r.w.HandsOver, dir); v != "" {
		violations = append(violations, v)
	}
	if v := r.keysLeft(ctx, ops); v != "" {
		violations = append(violations, v)
	}
	for _, prefix := range r.w.partnerPrefixes(r.name) {
		if v := r.awaitEmpty(ctx, prefix); v != "" {
			violations = append(violations, v)
		}
	}
	return summarize(ops, landed), violations, nil
}

// summarize counts the operations by kind and outcome; read holds only if there are any.
func summarize(ops []Op, landed map[int64]bool) string {
	var n [ReadRelease + 1][Ambiguous + 1]int
	amb := 0
	for _, op := range ops {
		n[op.Kind][op.Outcome]++
		if op.Kind == Write && op.Outcome == Ambiguous && landed[op.WriteID] {
			amb++
		}
	}
	s := fmt.Sprintf("%d acquires; writes: %d accepted, %d refused, %d ambiguous (%d landed); releases: %d ok, %d lost, %d ambiguous",
		n[Acquire][OK], n[Write][OK], n[Write][Refused], n[Write][Ambiguous], amb, n[Release][OK], n[Release][Refused], n[Release][Ambiguous])
	if n[ReadAcquire][OK] > 0 {
		s += fmt.Sprintf("; %d read holds; read releases: %d ok, %d lost, %d ambiguous",
			n[ReadAcquire][OK], n[ReadRelease][OK], n[ReadRelease][Refused], n[ReadRelease][Ambiguous])
	}
	return s
}

// registerViolations checks that exactly the accepted writes and the ambiguous ones that
// landed left a marker, and that the register counts them all: none lost, none doubled.
func registerViolations(ops []Op, landed map[int64]bool, value int64, slots int) []string {
	var v []string
	want := int64(0)
	for _, op := range ops {
		if op.Kind != Write {
			continue
		}
		switch {
		case op.Outcome == OK && !landed[op.WriteID]:
			v = append(v, fmt.Sprintf("accepted write left no marker: %v", op))
		case op.Outcome == Refused && landed[op.WriteID]:
			v = append(v, fmt.Sprintf("refused write left a marker: %v", op))
		}
		if landed[op.WriteID] {
			want++
		}
	}
	if got := int64(len(landed)); got != want {
		v = append(v, fmt.Sprintf("%d markers, but %d writes landed", got, want))
	}
	if value != want {
		v = append(v, fmt.Sprintf("register is %d after %d writes landed (slots %d): lost or doubled increments", value, want, slots))
	}
	return v
}

// hold is a hold that was released cleanly: it surely held from when its acquire returned
// until its release was called.
type hold struct{ acquire, release Op }

// exclusionViolations reports every moment holds released cleanly held more than slots at
// once (their units, for holds of several). Holds that were lost or whose release is unknown
// may legitimately overlap a later one (their lease expired) and are left out.
func exclusionViolations(ops []Op, slots int) []string {
	var v []string
	var active []hold
	for _, h := range cleanHolds(ops) {
		active = slices.DeleteFunc(active, func(a hold) bool { return a.release.Call <= h.acquire.Return })
		active = append(active, h)
		units := 0
		for _, a := range active {
			units += max(a.acquire.Units, 1)
		}
		if units > slots {
			var b strings.Builder
			fmt.Fprintf(&b, "%d holds released cleanly overlap, %d units (slots %d):", len(active), units, slots)
			for _, a := range active {
				fmt.Fprintf(&b, "\n\tworker %d token %d units %d held [%v, %v]", a.acquire.Worker, a.acquire.Token, max(a.acquire.Units, 1), a.acquire.Return, a.release.Call)
			}
			v = append(v, b.String())
		}
	}
	return v
}

// cleanHolds returns the (write) holds released cleanly, by the time their acquire returned.
func cleanHolds(ops []Op) []hold {
	type holder struct {
		worker int
		token  int64 // one token may be two holds: a hold handed over (Workload.HandsOver)
	}
	acquired := map[holder]Op{}
	var holds []hold
	for _, op := range ops {
		switch {
		case op.Kind == Acquire:
			acquired[holder{op.Worker, op.Token}] = op
		case op.Kind == Release && op.Outcome == OK:
			if a, ok := acquired[holder{op.Worker, op.Token}]; ok {
				holds = append(holds, hold{a, op})
			}
		}
	}
	slices.SortFunc(holds, func(a, b hold) int { return cmp.Compare(a.acquire.Return, b.acquire.Return) })
	return holds
}

// linearizability checks the history against lockModel with porcupine and describes the
// failure, if any, writing porcupine's visualization to dir. The model has no readers:
// read holds are left out, and readWriteViolations checks them.
func linearizability(ops []Op, landed map[int64]bool, slots, workers int, handsOver bool, dir string) string {
	model := lockModel(slots, handsOver)
	history := operations(ops, landed, workers)
	result, info := porcupine.CheckOperationsVerbose(model, history, linearizeTimeout)
	switch result {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		return fmt.Sprintf("porcupine could not decide linearizability within %v (%d operations)", linearizeTimeout, len(history))
	}
	msg := fmt.Sprintf("the history is not linearizable against a lock with %d slot(s) guarding a fenced register (porcupine)", slots)
	if dir != "" {
		path := filepath.Join(dir, "linearizability.html")
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			msg += "; visualization in " + path
		}
		var b strings.Builder
		for _, op := range ops {
			fmt.Fprintln(&b, op)
		}
		path = filepath.Join(dir, "history.txt")
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err == nil {
			msg += "; history in " + path
		}
	}
	return msg + "\nthe first operations that no linearization reaches:\n" + stuckAt(info, history)
}

// stuckAt lists the earliest operations outside the longest partial linearization: the
// first of them is one the model cannot take in any order consistent with real time.
func stuckAt(info porcupine.LinearizationInfo, history []porcupine.Operation) string {
	var longest []int
	for _, part := range info.PartialLinearizations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	var rest []porcupine.Operation
	for id, op := range history {
		if !slices.Contains(longest, id) {
			rest = append(rest, op)
		}
	}
	slices.SortFunc(rest, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	var b strings.Builder
	for _, op := range rest[:min(len(rest), 8)] {
		fmt.Fprintf(&b, "\t%v\n", op.Metadata)
	}
	return b.String()
}

// keysLeft waits for the lock's prefix to be empty: the keys of Lock calls that were
// abandoned while their client was cut off disappear when their lease expires, within a
// TTL. It lists the keys if any remain after twice that.
func (r *Run) keysLeft(ctx context.Context, ops []Op) string {
	prefix := r.w.Prefix(r.name)
	left, err := r.awaitNoKeys(ctx, prefix)
	switch {
	case err != nil:
		return fmt.Sprintf("keys left under %q: %v", prefix, err)
	case len(left) == 0:
		return ""
	}
	var b strings.Builder
	for _, kv := range left {
		fmt.Fprintf(&b, "\n\t%s (create revision %d, lease %x): %s", kv.Key, kv.CreateRevision, kv.Lease, tokenFate(ops, kv.CreateRevision, r.w.OpenReader != nil))
	}
	if failed := r.hist.FailedLocks(); len(failed) > 0 {
		fmt.Fprintf(&b, "\n\t%d Lock and RLock calls failed, the last ones:", len(failed))
		for _, op := range failed[max(0, len(failed)-5):] {
			fmt.Fprintf(&b, "\n\t\t%v", op)
		}
	}
	return fmt.Sprintf("%d keys left under %q after every worker released and a lease could expire:%s", len(left), prefix, b.String())
}

// awaitEmpty is keysLeft for a prefix outside the history: "" once it is empty, else what
// is left.
func (r *Run) awaitEmpty(ctx context.Context, prefix string) string {
	left, err := r.awaitNoKeys(ctx, prefix)
	switch {
	case err != nil:
		return fmt.Sprintf("keys left under %q: %v", prefix, err)
	case len(left) == 0:
		return ""
	}
	var b strings.Builder
	for _, kv := range left {
		fmt.Fprintf(&b, "\n\t%s (create revision %d, lease %x)", kv.Key, kv.CreateRevision, kv.Lease)
	}
	return fmt.Sprintf("%d keys left under %q after every worker released and a lease could expire:%s", len(left), prefix, b.String())
}

// awaitNoKeys waits, woken by a watch, up to twice the TTL and 5 s for prefix to be empty,
// and returns the keys left then.
func (r *Run) awaitNoKeys(ctx context.Context, prefix string) ([]*mvccpb.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*r.w.TTL+5*time.Second)
	defer cancel()
	for {
		resp, err := r.env.Admin.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) == 0 {
			return nil, nil
		}
		wctx, stopWatch := context.WithCancel(ctx)
		wch := r.env.Admin.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		select {
		case <-wch:
			stopWatch()
		case <-ctx.Done():
			stopWatch()
			return resp.Kvs, nil
		}
	}
}

// tokenFate says what the history knows of the hold with token: a key nobody acquired with
// is a waiter's, left by a Lock that failed, or, with readers, a reader's (read holds have
// no token in the history).
func tokenFate(ops []Op, token int64, readers bool) string {
	var fate []string
	for _, op := range ops {
		if op.Token == token && (op.Kind == Acquire || op.Kind == Release) {
			fate = append(fate, op.String())
		}
	}
	switch {
	case len(fate) > 0:
		return strings.Join(fate, "; ")
	case readers:
		return "no writer acquired with it: a reader's key, or the key of a Lock or RLock that failed or was abandoned"
	}
	return "never acquired: the key of a Lock that failed or was abandoned"
}
