package once

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/mutex"
)

// MinPeriod is the shortest period a Job takes.
const MinPeriod = time.Second

// recordGrace is how long the record of a period done may still be written once Run's ctx
// has ended: fn succeeded, and a run that is not recorded may be run again.
const recordGrace = 10 * time.Second

// A Job is a job that runs at most once per period across every process that runs a Job of
// the same name (and prefix) and period; see the package doc. A Job's methods are safe for
// use by several goroutines; its Runs take turns, as a Mutex's Locks do. Only [New] makes a
// usable Job: the others' methods return [ErrInvalidOption].
type Job struct {
	name   string
	cli    *clientv3.Client
	period time.Duration
	key    string // the record's
	m      *mutex.Mutex
}

// Record is what a Job's record says of the last period done.
type Record struct {
	Start  time.Time     // the period's start: a whole multiple of Period since the Unix epoch
	Period time.Duration // the period of the Job that recorded it
	At     time.Time     // when the run that recorded it returned
	Token  int64         // the fencing token of the hold it ran under
	Owner  string        // who ran it: "host=H pid=P since=T", the lock's key value
}

// New returns the Job of name over cli, run at most once per period. It does no I/O.
//
// Errors, wrapped with the detail: [ErrInvalidName] for a bad name; [ErrInvalidOption] for a
// period under [MinPeriod], a nil cli, or an option a lock does not take.
func New(cli *clientv3.Client, name string, period time.Duration, opts ...Option) (*Job, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, fmt.Errorf("once: %w", err)
	}
	if period < MinPeriod {
		return nil, fmt.Errorf("once %q: %w: a period of %v is under %v", name, ErrInvalidOption, period, MinPeriod)
	}
	cfg, err := core.OptionsFor("a once job", core.ForLock, opts)
	if err != nil {
		return nil, fmt.Errorf("once %q: %w", name, err)
	}
	m, err := mutex.New(cli, name, opts...)
	if err != nil {
		return nil, fmt.Errorf("once %q: %w", name, err)
	}
	return &Job{name: name, cli: cli, period: period, key: core.OnceRecordKey(cfg.KeyPrefix(name)), m: m}, nil
}

// Run waits for the name's hold, and under it runs fn unless the period the local clock is
// in is recorded done (then ran is false and fn is not called). fn's ctx ends when ctx does
// or the hold ends (see [mutex.Mutex.Do]); [Start] tells fn the period it runs for. When fn
// returns nil, Run records the period done, fenced by the hold; then it releases the hold.
// It is [Job.Mutex]'s Do around [Job.Due], fn and [Job.Complete].
//
// Errors: the lock's ([mutex.Mutex.Lock]'s, without running fn); fn's own, with nothing
// recorded; one matching [ErrLost] when the hold was lost before the period was recorded
// (fn's ctx ended; whatever fn returned, the period is not recorded); Due's and Complete's.
// A nil fn is [ErrInvalidOption], and nothing is acquired.
//
// Cost: the lock's Lock and Unlock, one Range, and one Txn when fn ran and returned nil.
func (j *Job) Run(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	if j == nil || j.m == nil {
		return false, fmt.Errorf("once: run: %w", (*core.Queue)(nil).Unusable())
	}
	if fn == nil {
		return false, j.errorf("run", core.ErrNilFunc)
	}
	err = j.m.Do(ctx, func(ctx context.Context) error {
		p, due, err := j.due(ctx)
		if err != nil || !due {
			return err
		}
		ran = true
		if err := fn(context.WithValue(ctx, startKey{}, p.Start)); err != nil {
			return err
		}
		wctx, cancel := core.Outlive(ctx, recordGrace)
		defer cancel()
		return j.complete(wctx, p)
	})
	if err != nil {
		return ran, j.errorf("run", err)
	}
	return ran, nil
}

// A Period is a period of a Job as [Job.Due] read it under the Job's hold.
type Period struct {
	Start  time.Time // its start: a whole multiple of the Job's period since the Unix epoch, UTC
	modRev int64     // the record's mod revision when Due read it; 0 for none
}

// Due reads the record under the hold of [Job.Mutex], which the caller holds, and reports
// the period the local clock is in, and whether it is due: neither it nor a later period is
// recorded done. For a caller that takes the hold its own way (the command does, to bound
// only its wait): run the job if due, then [Job.Complete], then Unlock. Run does all of it.
//
// Errors: the read's (ctx's, etcd's); a record that is not one a Job wrote.
//
// Cost: one Range.
func (j *Job) Due(ctx context.Context) (p Period, due bool, err error) {
	if j == nil || j.m == nil {
		return Period{}, false, fmt.Errorf("once: due: %w", (*core.Queue)(nil).Unusable())
	}
	if p, due, err = j.due(ctx); err != nil {
		return Period{}, false, j.errorf("due", err)
	}
	return p, due, nil
}

func (j *Job) due(ctx context.Context) (p Period, due bool, err error) {
	value, modRev, err := readRecord(ctx, j.cli, j.key)
	if err != nil {
		return Period{}, false, err
	}
	last, err := parseRecord(value)
	if err != nil {
		return Period{}, false, err
	}
	p = Period{Start: periodStart(time.Now(), j.period), modRev: modRev}
	return p, last.Start.IsZero() || last.Start.Before(p.Start), nil
}

// Complete records p done, in one Txn that succeeds only while the caller holds
// [Job.Mutex]'s hold and the record is as [Job.Due] read it.
//
// Errors: one matching [ErrLost] when the hold is gone (nothing recorded); [ErrNotLocked]
// without a hold; the record changed since Due read it (written by hand), nothing recorded;
// the write's (ctx's, etcd's).
//
// Cost: one Txn.
func (j *Job) Complete(ctx context.Context, p Period) error {
	if j == nil || j.m == nil {
		return fmt.Errorf("once: complete: %w", (*core.Queue)(nil).Unusable())
	}
	if err := j.complete(ctx, p); err != nil {
		return j.errorf("complete", err)
	}
	return nil
}

func (j *Job) complete(ctx context.Context, p Period) error {
	key, token := j.m.Key(), j.m.Token()
	if token == 0 {
		return fmt.Errorf("%w: the job's lock is not held", ErrNotLocked)
	}
	rec := Record{Start: p.Start, Period: j.period, At: time.Now(), Token: token, Owner: core.OwnerValue("")}
	written, err := putRecordIf(ctx, j.cli, key, token, j.key, p.modRev, rec.encode())
	switch {
	case err != nil:
		return fmt.Errorf("record the period of %v done: %w", p.Start.Format(time.RFC3339), err)
	case !written:
		return fmt.Errorf("the record changed since it was read (written by hand?): the period of %v is not recorded",
			p.Start.Format(time.RFC3339))
	}
	return nil
}

// Mutex is the Job's lock, on its name: for a caller that holds it its own way around
// [Job.Due] and [Job.Complete]. Its Do is Run's.
func (j *Job) Mutex() *mutex.Mutex {
	if j == nil {
		return nil
	}
	return j.m
}

// Last is the record of the last period done; the zero Record when none was recorded.
//
// Errors: the read's (ctx's, etcd's); a record that is not one a Job wrote.
//
// Cost: one Range.
func (j *Job) Last(ctx context.Context) (Record, error) {
	if j == nil || j.m == nil {
		return Record{}, fmt.Errorf("once: last: %w", (*core.Queue)(nil).Unusable())
	}
	value, _, err := readRecord(ctx, j.cli, j.key)
	if err != nil {
		return Record{}, j.errorf("last", err)
	}
	rec, err := parseRecord(value)
	if err != nil {
		return Record{}, j.errorf("last", err)
	}
	return rec, nil
}

// Delete deletes the record, so that the next Run runs in any period: for a job's end, or
// a period to run again. The record has no lease and stays until deleted.
//
// Errors: the delete's (ctx's, etcd's).
//
// Cost: one Delete.
func (j *Job) Delete(ctx context.Context) error {
	if j == nil || j.m == nil {
		return fmt.Errorf("once: delete: %w", (*core.Queue)(nil).Unusable())
	}
	if _, err := j.cli.Delete(clientv3.WithRequireLeader(ctx), j.key); err != nil {
		return j.errorf("delete", err)
	}
	return nil
}

// Start is the start of the period the run whose fn has ctx runs for; the zero Time for a
// ctx that is no Run's.
func Start(ctx context.Context) time.Time {
	t, _ := ctx.Value(startKey{}).(time.Time)
	return t
}

type startKey struct{}

// periodStart is the start of the period of length p that t is in, counted from the Unix
// epoch, in UTC.
func periodStart(t time.Time, p time.Duration) time.Time {
	n := t.UnixNano()
	return time.Unix(0, n-n%int64(p)).UTC()
}

// wireRecord is a Record as the key holds it: JSON that `etcdctl get` shows readably.
type wireRecord struct {
	Start  time.Time `json:"start"`
	Period string    `json:"period"`
	At     time.Time `json:"at"`
	Token  int64     `json:"token"`
	Owner  string    `json:"owner"`
}

func (r Record) encode() string {
	b, _ := json.Marshal(wireRecord{Start: r.Start.UTC(), Period: r.Period.String(), At: r.At.UTC(), Token: r.Token, Owner: r.Owner})
	return string(b)
}

var errBadRecord = errors.New("the record is not one a once job wrote")

// parseRecord reads a record's value; the zero Record for none ("").
func parseRecord(value string) (Record, error) {
	if value == "" {
		return Record{}, nil
	}
	var w wireRecord
	if err := json.Unmarshal([]byte(value), &w); err != nil {
		return Record{}, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	p, err := time.ParseDuration(w.Period)
	if err != nil || w.Start.IsZero() {
		return Record{}, fmt.Errorf("%w: %q", errBadRecord, value)
	}
	return Record{Start: w.Start, Period: p, At: w.At, Token: w.Token, Owner: w.Owner}, nil
}

func (j *Job) errorf(op string, err error) error {
	return fmt.Errorf("once %q: %s: %w", j.name, op, err)
}
