package fencetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/fence"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// eachBackend runs test on every backend, in parallel.
func eachBackend(t *testing.T, test func(t *testing.T, db *database)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, b.newDatabase(t))
		})
	}
}

// placeholder is the dialect's bind parameter n (from 1).
func placeholder(d fence.Dialect, n int) string {
	if d == fence.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

// createWrites makes the data table a fenced transaction writes to.
func createWrites(t testing.TB, db *database) {
	t.Helper()
	_, err := db.ExecContext(etcdtest.Context(t), "CREATE TABLE writes (resource VARCHAR(600) NOT NULL, token BIGINT NOT NULL, note VARCHAR(100) NOT NULL)")
	require.NoError(t, err)
}

// fencedWrite writes (resource, token, note) to writes in a transaction fenced on resource
// with token; it returns Check's error, having rolled back, or the commit's.
func fencedWrite(ctx context.Context, db *database, table *fence.Table, res string, token int64, note string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := table.Check(ctx, tx, res, token); err != nil {
		return err
	}
	d := db.b.dialect
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO writes (resource, token, note) VALUES (%s, %s, %s)",
		placeholder(d, 1), placeholder(d, 2), placeholder(d, 3)), res, token, note); err != nil {
		return err
	}
	return tx.Commit()
}

// notes returns the notes of the writes committed, in token order, then note order.
func notes(t testing.TB, db *database) []string {
	t.Helper()
	rows, err := db.QueryContext(etcdtest.Context(t), "SELECT note FROM writes ORDER BY token, note")
	require.NoError(t, err)
	defer rows.Close()
	var got []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		got = append(got, n)
	}
	require.NoError(t, rows.Err())
	return got
}

// stored returns the fence row's token for res, and whether there is one.
func stored(t testing.TB, db *database, table *fence.Table, res string) (int64, bool) {
	t.Helper()
	var tok int64
	err := db.QueryRowContext(etcdtest.Context(t),
		fmt.Sprintf("SELECT token FROM %s WHERE resource = %s", quoted(table), placeholder(db.b.dialect, 1)), res).Scan(&tok)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false
	}
	require.NoError(t, err)
	return tok, true
}

// rowCount returns how many rows table has.
func rowCount(t testing.TB, db *database, table *fence.Table) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(etcdtest.Context(t), "SELECT count(*) FROM "+quoted(table)).Scan(&n))
	return n
}

// quoted is table's name quoted as its dialect quotes it (as package fence does).
func quoted(table *fence.Table) string {
	if table.Dialect() == fence.MySQL {
		return "`" + table.Name() + "`"
	}
	return `"` + table.Name() + `"`
}

func TestCheckRaisesTheTokenPassesAnEqualOneAndRefusesALowerOne(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "")
		createWrites(t, db)

		require.NoError(t, fencedWrite(ctx, db, table, "job", 5, "5 first"))
		require.NoError(t, fencedWrite(ctx, db, table, "job", 5, "5 again")) // a holder writes many times
		require.NoError(t, fencedWrite(ctx, db, table, "job", 7, "7"))
		err := fencedWrite(ctx, db, table, "job", 6, "6 late")
		assert.ErrorIs(t, err, fence.ErrStale)
		assert.ErrorIs(t, err, etcdsync.ErrLost)
		err = fencedWrite(ctx, db, table, "job", 5, "5 late")
		assert.ErrorIs(t, err, fence.ErrStale)

		assert.Equal(t, []string{"5 again", "5 first", "7"}, notes(t, db))
		tok, ok := stored(t, db, table, "job")
		assert.True(t, ok)
		assert.EqualValues(t, 7, tok)
	})
}

// A caller that commits despite ErrStale commits its own writes, but never lowers the fence
// row: every later check still compares with the highest token.
func TestAStaleCheckLeavesTheRowAsItWas(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "")
		createWrites(t, db)
		require.NoError(t, fencedWrite(ctx, db, table, "job", 9, "9"))
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.ErrorIs(t, table.Check(ctx, tx, "job", 4), fence.ErrStale)
		require.NoError(t, tx.Commit()) // the caller's mistake
		tok, _ := stored(t, db, table, "job")
		assert.EqualValues(t, 9, tok)
		assert.ErrorIs(t, fencedWrite(ctx, db, table, "job", 8, "8"), fence.ErrStale)
	})
}

// Resources are compared byte for byte: case, trailing spaces and accents make other
// resources (MySQL's default collations would fold them together), and the longest one fits.
func TestResourcesAreComparedByteForByte(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "fence_bytes")
		createWrites(t, db)
		longest := strings.Repeat("é", fence.MaxResource/2) // 512 bytes, 256 characters
		require.NoError(t, fencedWrite(ctx, db, table, "jobs", 9, "jobs"))
		for i, res := range []string{"Jobs", "jobs ", "jöbs", "jobs/a", longest} {
			assert.NoError(t, fencedWrite(ctx, db, table, res, 1, strconv.Itoa(i)), "%q", res)
			tok, ok := stored(t, db, table, res)
			assert.True(t, ok && tok == 1, "%q: %d, %v", res, tok, ok)
		}
		tok, _ := stored(t, db, table, "jobs")
		assert.EqualValues(t, 9, tok)
		assert.Equal(t, 6, rowCount(t, db, table))
	})
}

// Bad input is refused with ErrInvalidOption before any SQL: the transaction is still usable
// (on PostgreSQL a failed statement would have aborted it) and commits nothing of the fence.
func TestBadInputWritesNothing(t *testing.T) {
	bad := []struct {
		name     string
		resource string
		token    int64
	}{
		{"token 0", "job", 0},
		{"token -1", "job", -1},
		{"lowest token", "job", -1 << 63},
		{"empty resource", "", 5},
		{"NUL in resource", "jo\x00b", 5},
		{"resource not UTF-8", "jo\xffb", 5},
		{"resource over 512 bytes", strings.Repeat("j", fence.MaxResource+1), 5},
	}
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "")
		for _, tc := range bad {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			err = table.Check(ctx, tx, tc.resource, tc.token)
			assert.ErrorIs(t, err, etcdsync.ErrInvalidOption, tc.name)
			assert.NotErrorIs(t, err, fence.ErrStale, tc.name)
			var one int
			assert.NoError(t, tx.QueryRowContext(ctx, "SELECT 1").Scan(&one), "%s: the transaction is not usable", tc.name)
			assert.NoError(t, tx.Commit(), tc.name)
		}
		err := table.Check(ctx, nil, "job", 5)
		assert.ErrorIs(t, err, etcdsync.ErrInvalidOption, "nil tx")
		assert.Zero(t, rowCount(t, db, table))

		// A table name that is not an identifier never reaches the database.
		for _, name := range []string{"writes; DROP TABLE victim", `victim"`, "victim--", "x y"} {
			_, err := fence.NewTable(db.b.dialect, name)
			assert.ErrorIs(t, err, etcdsync.ErrInvalidOption, "%q", name)
		}
	})
}

// Replicas that start at the same moment all create the table at once: every Create
// succeeds (PostgreSQL's own CREATE TABLE IF NOT EXISTS would fail some).
func TestCreatesAtOnceAllSucceed(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		for i := range 5 {
			table, err := fence.NewTable(db.b.dialect, fmt.Sprintf("fence_at_once_%d", i))
			require.NoError(t, err)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for j := range errs {
				wg.Go(func() { errs[j] = table.Create(ctx, db.DB) })
			}
			wg.Wait()
			for _, err := range errs {
				assert.NoError(t, err)
			}
			assert.Zero(t, rowCount(t, db, table))
		}
	})
}

// Create makes the table once, and again leaves it as it is.
func TestCreateIsIdempotent(t *testing.T) {
	eachBackend(t, func(t *testing.T, db *database) {
		ctx := etcdtest.Context(t)
		table := table(t, db, "Fence_Custom") // quoted: the case is kept
		createWrites(t, db)
		require.NoError(t, fencedWrite(ctx, db, table, "job", 3, "3"))
		require.NoError(t, table.Create(ctx, db.DB))
		tok, ok := stored(t, db, table, "job")
		assert.True(t, ok)
		assert.EqualValues(t, 3, tok)
	})
}
