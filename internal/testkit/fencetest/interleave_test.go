package fencetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/fence"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// Two transactions fenced on one resource, one with token 5 (a holder that lost its hold)
// and one with token 6 (its successor), run step by step in a given order on connections of
// their own. Each takes four steps: read (its first statement, which starts a snapshot under
// REPEATABLE READ), check, write (a row of its own in a data table) and end (commit if all
// went well, else roll back). A step that waits for a lock the other holds stays under way
// (the server says so: see waiting) while the other goes on. SQLite's connections wait for no lock here (busy_timeout 0): a step that meets the
// other's write lock fails at once with SQLITE_BUSY instead.

const (
	lowToken  = 5
	highToken = 6
	resource  = "job"
)

// initialState is what the fence row holds before the two begin.
type initialState struct {
	name  string
	token int64 // 0: no row
}

var initialStates = []initialState{{"no row yet", 0}, {"row at 4", 4}}

// outcome is how a transaction of an interleaving ended.
type outcome int

const (
	committed outcome = iota + 1
	stale             // Check returned ErrStale; rolled back
	retry             // the database said roll back and try again; rolled back
)

func (o outcome) String() string {
	return map[outcome]string{committed: "committed", stale: "stale", retry: "retry"}[o]
}

// session is one transaction of an interleaving.
type session struct {
	token int64
	conn  *sql.Conn
	id    int64 // the server's id of conn
	tx    *sql.Tx
	next  int        // the next step, 0 to 4
	under chan error // the step under way, waiting for a lock; nil if none

	err       error // the first error of a step; the steps after it but end do nothing
	result    outcome
	checkedAt int // the clock when its check returned; 0 if it did not
	endedAt   int // the clock when it committed or rolled back
}

// interleaving runs two sessions on one database.
type interleaving struct {
	t     testing.TB
	ctx   context.Context
	db    *database
	table *fence.Table
	iso   sql.IsolationLevel
	clock int
	trace []string // what happened, for failure messages
}

var stepNames = [...]string{"read", "check", "write", "end"}

// waiting reports whether s waits for a lock, as the server says; never on SQLite. MariaDB
// says which transactions wait in information_schema.innodb_trx, but from a cache refreshed
// only once nobody has read it for 100 ms: its count of row locks waited for now is current,
// and only this interleaving waits on its server (the other tests on it run before or after).
func (il *interleaving) waiting(s, other *session) bool {
	var n int
	switch il.db.b {
	case postgres:
		require.NoError(il.t, il.db.QueryRowContext(il.ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'", s.id).Scan(&n))
	case mariadb:
		require.NoError(il.t, il.db.QueryRowContext(il.ctx,
			"SELECT variable_value FROM information_schema.global_status WHERE variable_name = 'INNODB_ROW_LOCK_CURRENT_WAITS'").Scan(&n))
		if other.under != nil {
			n-- // the other's
		}
	}
	return n > 0
}

// begin opens a session for token on a connection of its own.
func (il *interleaving) begin(token int64) *session {
	conn, err := il.db.Conn(il.ctx)
	require.NoError(il.t, err)
	s := &session{token: token, conn: conn}
	switch il.db.b {
	case postgres:
		require.NoError(il.t, conn.QueryRowContext(il.ctx, "SELECT pg_backend_pid()").Scan(&s.id))
	case mariadb:
		require.NoError(il.t, conn.QueryRowContext(il.ctx, "SELECT CONNECTION_ID()").Scan(&s.id))
	}
	s.tx, err = conn.BeginTx(il.ctx, &sql.TxOptions{Isolation: il.iso})
	require.NoError(il.t, err)
	return s
}

// do runs s's step.
func (il *interleaving) do(s *session, step int) error {
	if s.err != nil && step < 3 {
		return nil
	}
	switch step {
	case 0:
		var n int
		return s.tx.QueryRowContext(il.ctx, "SELECT count(*) FROM writes").Scan(&n)
	case 1:
		return il.table.Check(il.ctx, s.tx, resource, s.token)
	case 2:
		_, err := s.tx.ExecContext(il.ctx, fmt.Sprintf("INSERT INTO writes (token) VALUES (%d)", s.token))
		return err
	}
	if s.err != nil {
		_ = s.tx.Rollback() // a deadlock or a failed commit may have ended it already
		return nil
	}
	return s.tx.Commit()
}

// advance runs s's next step, and returns once it has returned or waits for a lock.
func (il *interleaving) advance(s, other *session) {
	step := s.next
	s.next++
	done := make(chan error, 1)
	go func() { done <- il.do(s, step) }()
	il.await(s, other, step, done)
}

// await returns once s's step has returned (and records how), or once s waits for a lock
// (and leaves the step under way). Nothing tells a client that another connection waits,
// so it asks the server every millisecond.
func (il *interleaving) await(s, other *session, step int, done chan error) {
	for {
		select {
		case err := <-done:
			il.returned(s, step, err)
			return
		case <-time.After(time.Millisecond):
		}
		if il.waiting(s, other) {
			s.under = done
			il.trace = append(il.trace, fmt.Sprintf("%d %s waits", s.token, stepNames[step]))
			return
		}
	}
}

// returned records how s's step ended.
func (il *interleaving) returned(s *session, step int, err error) {
	s.under = nil
	il.clock++
	what := "ok"
	switch {
	case err == nil:
	case errors.Is(err, fence.ErrStale):
		what = "stale"
	default:
		what = err.Error()
	}
	il.trace = append(il.trace, fmt.Sprintf("%d %s: %s", s.token, stepNames[step], what))
	if err != nil && s.err == nil {
		s.err = err
	}
	if step == 1 && (err == nil || errors.Is(err, fence.ErrStale)) {
		s.checkedAt = il.clock
	}
	if step == 3 {
		s.endedAt = il.clock
		switch {
		case s.err == nil:
			s.result = committed
		case errors.Is(s.err, fence.ErrStale):
			s.result = stale
		default:
			s.result = retry
		}
	}
}

// settle waits for each session's step under way that the other's last step let go: once
// the other has ended, or was rolled back by MariaDB as a deadlock's victim, nothing holds
// the lock the step waits for (only these two transactions run on the server). It does
// not ask the server whether a step still waits: a waiter that a commit has just let go
// may be seen waiting for a moment more. A step whose blocker lives on stays under way.
func (il *interleaving) settle(a, b *session) {
	for again := true; again; {
		again = false
		for _, pair := range [2][2]*session{{a, b}, {b, a}} {
			s, other := pair[0], pair[1]
			if s.under != nil && other.under == nil && (other.next == 4 || il.db.b.rolledBack(other.err)) {
				il.returned(s, s.next-1, <-s.under)
				again = true
			}
		}
	}
}

// run plays order ("5566" ...: whose step next) from state, and returns the two sessions
// (low, high) when every step was played; ok is false when order asked for a step of a
// session whose step waits, which no real schedule can do.
func (il *interleaving) run(state initialState, order string) (low, high *session, ok bool) {
	il.reset(state)
	il.trace = []string{fmt.Sprintf("%s, %v, order %s", state.name, il.iso, order)}
	il.clock = 0
	low, high = il.begin(lowToken), il.begin(highToken)
	both := []*session{low, high}
	defer func() {
		// A session whose step is under way cannot roll back before that step returns,
		// which may be once the other has rolled back.
		for _, s := range both {
			if s.under == nil && s.next < 4 {
				_ = s.tx.Rollback()
			}
		}
		for _, s := range both {
			if s.under != nil {
				<-s.under
				_ = s.tx.Rollback()
			}
			s.conn.Close()
		}
	}()
	for _, c := range order {
		s, other := low, high
		if c == '6' {
			s, other = high, low
		}
		if s.under != nil {
			return nil, nil, false
		}
		il.advance(s, other)
		il.settle(s, other)
	}
	return low, high, true
}

// reset empties the tables and sets the fence row to state.
func (il *interleaving) reset(state initialState) {
	_, err := il.db.ExecContext(il.ctx, "DELETE FROM writes")
	require.NoError(il.t, err)
	_, err = il.db.ExecContext(il.ctx, "DELETE FROM "+quoted(il.table))
	require.NoError(il.t, err)
	if state.token > 0 {
		_, err = il.db.ExecContext(il.ctx, fmt.Sprintf("INSERT INTO %s (resource, token) VALUES ('%s', %d)",
			quoted(il.table), resource, state.token))
		require.NoError(il.t, err)
	}
}

// newInterleaving makes a database on b with a fence table and the data table. On SQLite its
// connections wait for no lock, so that a step never blocks the harness.
func newInterleaving(t *testing.T, b *backend, iso sql.IsolationLevel) *interleaving {
	db := b.newDatabase(t)
	if b == sqliteBackend {
		db = b.open(t, db.dsn+"&_pragma=busy_timeout(0)")
	}
	db.SetMaxIdleConns(3) // the two sessions' and the harness's: no new connection per order
	il := &interleaving{t: t, ctx: etcdtest.Context(t), db: db, iso: iso}
	il.table = table(t, db, "")
	_, err := db.ExecContext(il.ctx, "CREATE TABLE writes (token BIGINT NOT NULL)")
	require.NoError(t, err)
	return il
}

// orders returns every order of four steps of 5 and four of 6: 70.
func orders() []string {
	var all []string
	var walk func(prefix string, fives, sixes int)
	walk = func(prefix string, fives, sixes int) {
		if fives == 0 && sixes == 0 {
			all = append(all, prefix)
			return
		}
		if fives > 0 {
			walk(prefix+"5", fives-1, sixes)
		}
		if sixes > 0 {
			walk(prefix+"6", fives, sixes-1)
		}
	}
	walk("", 4, 4)
	return all
}

// committedTokens returns the tokens of the writes that committed, sorted, and the fence
// row's token (0 if none).
func (il *interleaving) committedTokens() (writes []int64, row int64) {
	rows, err := il.db.QueryContext(il.ctx, "SELECT token FROM writes ORDER BY token")
	require.NoError(il.t, err)
	defer rows.Close()
	for rows.Next() {
		var tok int64
		require.NoError(il.t, rows.Scan(&tok))
		writes = append(writes, tok)
	}
	require.NoError(il.t, rows.Err())
	err = il.db.QueryRowContext(il.ctx, "SELECT token FROM "+quoted(il.table)).Scan(&row)
	if !errors.Is(err, sql.ErrNoRows) {
		require.NoError(il.t, err)
	}
	return writes, row
}

// TestEveryInterleavingOfTwoHolders plays every order of the four steps of the two
// transactions (70, less those that would step a session whose step waits), from a fence row
// absent and at 4, at every isolation level, on every database, and checks in each:
//
//   - 5 never commits after 6 commits, and no write of a transaction that did not commit is
//     there; the fence row holds the highest token committed (or what it held);
//   - 6 is never stale; 5 is stale only once 6 has committed, before 5's check returned;
//   - a transaction ends in "retry" only by the database's serialization failure, deadlock
//     or busy (never on PostgreSQL under READ COMMITTED);
//   - one after the other, both commit when 5 goes first, and 5 is stale when 6 goes first.
func TestEveryInterleavingOfTwoHolders(t *testing.T) {
	all := orders()
	require.Len(t, all, 70)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			b.use(t)
			for _, iso := range b.isolations {
				t.Run(strings.ReplaceAll(iso.String(), " ", "-"), func(t *testing.T) {
					il := newInterleaving(t, b, iso)
					played := 0
					for _, state := range initialStates {
						for _, order := range all {
							low, high, ok := il.run(state, order)
							if !ok {
								continue
							}
							played++
							il.check(state, order, low, high)
							if t.Failed() {
								return // the first failure, with its trace, says enough
							}
						}
					}
					t.Logf("%d orders played of %d", played, 2*len(all))
				})
			}
		})
	}
}

// check asserts the properties of one interleaving (see TestEveryInterleavingOfTwoHolders).
func (il *interleaving) check(state initialState, order string, low, high *session) {
	t := il.t
	trace := strings.Join(il.trace, "\n")
	writes, row := il.committedTokens()
	var want []int64
	for _, s := range []*session{low, high} {
		if s.result == committed {
			want = append(want, s.token)
		}
	}
	assert.Equal(t, want, writes, "the writes committed\n%s", trace)
	if low.result == committed && high.result == committed {
		assert.Less(t, low.endedAt, high.endedAt, "5 committed after 6\n%s", trace)
	}
	wantRow := state.token
	for _, tok := range want {
		wantRow = max(wantRow, tok)
	}
	assert.Equal(t, wantRow, row, "the fence row\n%s", trace)
	assert.NotEqual(t, stale, high.result, "6 stale\n%s", trace)
	if low.result == stale {
		assert.True(t, high.result == committed && high.endedAt < low.checkedAt,
			"5 stale before 6 committed\n%s", trace)
	}
	for _, s := range []*session{low, high} {
		if s.result == retry {
			assert.True(t, il.db.b.retryable(s.err), "%d: an error that is not the database's retry: %v\n%s", s.token, s.err, trace)
			assert.False(t, il.db.b == postgres && il.iso == sql.LevelReadCommitted,
				"%d: retry on PostgreSQL under READ COMMITTED: %v\n%s", s.token, s.err, trace)
		}
	}
	switch order {
	case "55556666":
		assert.Equal(t, []outcome{committed, committed}, []outcome{low.result, high.result}, trace)
	case "66665555":
		assert.Equal(t, []outcome{stale, committed}, []outcome{low.result, high.result}, trace)
	}
}

// The interleavings named in the issue, each with its outcome on every database and level:
// who checks first, who commits first, overlapping. "refused" is stale, or (where the
// level makes a concurrent check a serialization failure) the database's retry.
func TestNamedInterleavings(t *testing.T) {
	type want struct{ low, high []outcome }
	type namedCase struct {
		name, order string
		want        want
		// waiter is the token whose check meets the other's row lock, which it waits for
		// (on SQLite: is refused busy at once); 0 if none.
		waiter int64
		// MariaDB's SERIALIZABLE locks the rows a read read, so the first's write waits for
		// the other's end: the order cannot be played there. With a waiter too, the two
		// wait for each other, and InnoDB rolls one back: which one, and whether the
		// other's wait is seen first, is InnoDB's choice, so the order may not be played.
		unplayableOnSerializableMariaDB bool
	}
	refused := []outcome{stale, retry}
	cases := []namedCase{
		{"5 commits, then 6 checks", "55556666", want{[]outcome{committed}, []outcome{committed}}, 0, false},
		{"6 commits, then 5 checks", "66665555", want{[]outcome{stale}, []outcome{committed}}, 0, false},
		// 5 checks first; 6's check waits for 5's commit, then passes.
		{"5 checks, 6 checks, 5 commits, 6 commits", "55665566", want{[]outcome{committed}, []outcome{committed, retry}}, highToken, true},
		// 6 checks first; 5's check waits for 6's commit, then finds 6.
		{"6 checks, 5 checks, 6 commits, 5 ends", "66556655", want{refused, []outcome{committed}}, lowToken, true},
		// Both read before either checks: a snapshot older than the other's commit.
		{"both read, 6 commits, then 5 checks", "56666555", want{refused, []outcome{committed}}, 0, true},
		{"both read, 5 commits, then 6 checks", "65555666", want{[]outcome{committed}, []outcome{committed, retry}}, 0, true},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, iso := range b.isolations {
				il := newInterleaving(t, b, iso)
				for _, tc := range cases {
					t.Run(strings.ReplaceAll(iso.String(), " ", "-")+"/"+tc.name, func(t *testing.T) {
						il.t = t
						for _, state := range initialStates {
							low, high, ok := il.run(state, tc.order)
							if !ok && b == mariadb && iso == sql.LevelSerializable && tc.unplayableOnSerializableMariaDB {
								continue
							}
							require.True(t, ok, "order %s cannot be played", tc.order)
							trace := strings.Join(il.trace, "\n")
							wantLow, wantHigh := tc.want.low, tc.want.high
							if b == mariadb && iso == sql.LevelSerializable && tc.unplayableOnSerializableMariaDB {
								// The two waited for each other: InnoDB rolled one back.
								wantLow, wantHigh = append(slices.Clip(wantLow), retry), append(slices.Clip(wantHigh), retry)
							}
							assert.Contains(t, wantLow, low.result, "5\n%s", trace)
							assert.Contains(t, wantHigh, high.result, "6\n%s", trace)
							if b == postgres && iso == sql.LevelReadCommitted || b == mariadb && iso != sql.LevelSerializable {
								assert.NotEqual(t, retry, low.result, "5\n%s", trace)
								assert.NotEqual(t, retry, high.result, "6\n%s", trace)
							}
							switch {
							case tc.waiter == 0:
							case b == sqliteBackend:
								waiter := map[int64]*session{lowToken: low, highToken: high}[tc.waiter]
								assert.Equal(t, retry, waiter.result, "%d: not refused busy\n%s", tc.waiter, trace)
							default:
								assert.Contains(t, il.trace, fmt.Sprintf("%d check waits", tc.waiter), trace)
							}
							il.check(state, tc.order, low, high)
						}
					})
				}
			}
		})
	}
}
