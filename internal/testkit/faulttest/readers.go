package faulttest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	readerHandles    = 2                     // Reader handles, each on a client of its own
	readersPerHandle = 2                     // reader workers sharing each handle
	readGap          = 10 * time.Millisecond // between a reader's holds, so that writers get in
)

// reader is a reader worker: it takes read holds on a handle that other readers share.
type reader struct {
	id  int // after the lock workers' ids, so that both can be told apart in the history
	cli *Client
	rd  Reader
}

// openReaders opens readerHandles handles on clients of their own, pinned and balanced
// like the lock workers', each shared by readersPerHandle readers: readers of one handle
// may share one key, the case a readers/writer lock gets wrong most easily.
func (r *Run) openReaders(t testing.TB) {
	t.Helper()
	for h := range readerHandles {
		cli := r.env.workerClient(t, len(r.workers)+h)
		rd, err := r.w.OpenReader(cli.Client, r.name)
		if err != nil {
			t.Fatal(err)
		}
		for range readersPerHandle {
			r.readers = append(r.readers, &reader{id: len(r.workers) + len(r.readers), cli: cli, rd: rd})
		}
	}
}

// read runs cycles of RLock, a read of the register, RUnlock until Stop.
func (r *Run) read(ctx context.Context, rd *reader) {
	for !r.stopped() {
		call := r.hist.Now()
		lctx, cancel := context.WithTimeout(ctx, lockTimeout)
		err := rd.rd.RLock(lctx)
		cancel()
		if err != nil {
			r.hist.lockFailed(rd.id, ReadAcquire, call, err)
			r.wait(pause)
			continue
		}
		r.hist.add(Op{Worker: rd.id, Kind: ReadAcquire, Call: call, Return: r.hist.Now()})
		r.readUnderHold(rd)
		r.readRelease(rd)
		r.wait(readGap)
	}
}

// readUnderHold reads the register, as a reader guarded by the lock would; a read that
// fails (during a fault) is of no consequence.
func (r *Run) readUnderHold(rd *reader) {
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), opTimeout)
	defer cancel()
	_, _ = rd.cli.Get(ctx, r.counter)
}

// readRelease is release for a reader. A reader whose RUnlock never got an answer opens a
// handle of its own, leaving the shared one to the others.
func (r *Run) readRelease(rd *reader) {
	op := Op{Worker: rd.id, Kind: ReadRelease, Call: r.hist.Now()}
	op.Outcome, op.Err = r.unlockUntilKnown(rd.rd.RUnlock)
	op.Return = r.hist.Now()
	r.hist.add(op)
	if op.Outcome == Ambiguous {
		if h, err := r.w.OpenReader(rd.cli.Client, r.name); err == nil {
			rd.rd = h
		}
	}
}

// readHolds returns the read holds released cleanly, each from its ReadAcquire to its
// worker's next ReadRelease (a reader holds one read hold at a time).
func readHolds(ops []Op) []hold {
	acquired := map[int]Op{}
	var holds []hold
	for _, op := range ops {
		switch op.Kind {
		case ReadAcquire:
			acquired[op.Worker] = op
		case ReadRelease:
			a, ok := acquired[op.Worker]
			delete(acquired, op.Worker)
			if ok && op.Outcome == OK {
				holds = append(holds, hold{a, op})
			}
		}
	}
	return holds
}

// readWriteViolations reports every read hold released cleanly that overlapped a write hold
// released cleanly, each held from its acquire's return to its release's call, as in
// exclusionViolations; read holds may overlap one another. Holds that were lost or whose
// release is unknown are left out: their lease may have expired before the other came.
func readWriteViolations(ops []Op) []string {
	writes := cleanHolds(ops)
	var v []string
	for _, rh := range readHolds(ops) {
		var b strings.Builder
		n := 0
		for _, wh := range writes { // by acquire: the first that starts after rh ends ends the search
			if wh.acquire.Return >= rh.release.Call {
				break
			}
			if rh.acquire.Return < wh.release.Call {
				n++
				fmt.Fprintf(&b, "\n\twriter worker %d token %d held [%v, %v]", wh.acquire.Worker, wh.acquire.Token, wh.acquire.Return, wh.release.Call)
			}
		}
		if n > 0 {
			v = append(v, fmt.Sprintf("a read hold released cleanly overlaps %d write hold(s) released cleanly:\n\treader worker %d held [%v, %v]%s",
				n, rh.acquire.Worker, rh.acquire.Return, rh.release.Call, b.String()))
		}
	}
	return v
}
