package fence

import (
	"context"
	"database/sql"
	"errors"
)

// statements are the SQL of one dialect for one table, its quoted name already in them.
type statements interface {
	create(ctx context.Context, db *sql.DB) error
	// check raises resource's row to token unless a higher token is stored, inside tx, and
	// reports whether token passed. The row is locked in tx from then on.
	check(ctx context.Context, tx *sql.Tx, resource string, token int64) (passed bool, err error)
}

// upsertReturning is the form of PostgreSQL and SQLite: one INSERT ... ON CONFLICT DO UPDATE
// whose WHERE lets only an equal or higher token update the row, and whose RETURNING yields a
// row only when the insert or the update happened. Why it is safe:
//
//   - PostgreSQL: the insert's new row, or the conflicting row, is locked by the statement
//     until the transaction ends, also when the WHERE fails. A concurrent Check of the same
//     resource waits for that end; under READ COMMITTED it then evaluates the WHERE against
//     the row as committed, so a lower token fails; under REPEATABLE READ and SERIALIZABLE
//     it fails with a serialization error instead, having written nothing.
//   - SQLite: the statement is a write, so it takes the database's write lock, which no
//     other connection can take until this transaction ends; whatever it reads is current.
type upsertReturning struct {
	// createLock, if not "", runs before createSQL in the same transaction, with createSQL
	// (which names the table) as its argument: PostgreSQL's CREATE TABLE IF NOT EXISTS is not
	// safe against itself (two at once can both find no table, and one then fails on the
	// catalog's unique index), so Creates of a table take turns on an advisory lock.
	createLock, createSQL, checkSQL string
}

func newPostgres(table string) upsertReturning {
	return upsertReturning{
		createLock: `SELECT pg_advisory_xact_lock(hashtext($1))`,
		createSQL:  `CREATE TABLE IF NOT EXISTS ` + table + ` (resource text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0))`,
		// docs/fencing.md runs the same statement from psql: keep them alike.
		checkSQL: `INSERT INTO ` + table + ` AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING f.token`,
	}
}

func newSQLite(table string) upsertReturning {
	return upsertReturning{
		createSQL: `CREATE TABLE IF NOT EXISTS ` + table + ` (resource TEXT NOT NULL PRIMARY KEY, token INTEGER NOT NULL CHECK (token > 0))`,
		checkSQL: `INSERT INTO ` + table + ` (resource, token) VALUES (?1, ?2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE token <= excluded.token
RETURNING token`,
	}
}

func (u upsertReturning) create(ctx context.Context, db *sql.DB) error {
	if u.createLock == "" {
		_, err := db.ExecContext(ctx, u.createSQL)
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // nothing to roll back after Commit
	if _, err := tx.ExecContext(ctx, u.createLock, u.createSQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, u.createSQL); err != nil {
		return err
	}
	return tx.Commit()
}

func (u upsertReturning) check(ctx context.Context, tx *sql.Tx, resource string, token int64) (bool, error) {
	var stored int64
	err := tx.QueryRowContext(ctx, u.checkSQL, resource, token).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil // the WHERE refused: a higher token is stored
	}
	return err == nil, err
}

// upsertThenLock is the form of MySQL and MariaDB, whose INSERT ... ON DUPLICATE KEY UPDATE
// has no RETURNING on MySQL, and whose affected-rows count depends on a client flag
// (CLIENT_FOUND_ROWS). An upsert raises the row to at least token, taking its exclusive lock
// until the transaction ends (a concurrent Check waits on it); then a locking read returns
// the token stored, which passes only if it is token. The read must lock: under REPEATABLE
// READ a plain read sees the transaction's snapshot, and a row the upsert left unchanged (a
// higher token stored) is not this transaction's own write, so the snapshot could show an
// older, lower token. A locking read sees the latest committed row at every isolation level.
type upsertThenLock struct{ createSQL, raiseSQL, readSQL string }

func newMySQL(table string) upsertThenLock {
	return upsertThenLock{
		// varbinary: resources compare byte for byte, not by a collation that folds case
		// or ignores trailing spaces.
		createSQL: "CREATE TABLE IF NOT EXISTS " + table + " (resource varbinary(512) NOT NULL PRIMARY KEY, token bigint NOT NULL CHECK (token > 0)) ENGINE=InnoDB",
		raiseSQL:  "INSERT INTO " + table + " (resource, token) VALUES (?, ?) ON DUPLICATE KEY UPDATE token = GREATEST(token, ?)",
		readSQL:   "SELECT token FROM " + table + " WHERE resource = ? FOR UPDATE",
	}
}

func (u upsertThenLock) create(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, u.createSQL)
	return err
}

func (u upsertThenLock) check(ctx context.Context, tx *sql.Tx, resource string, token int64) (bool, error) {
	if _, err := tx.ExecContext(ctx, u.raiseSQL, resource, token, token); err != nil {
		return false, err
	}
	var stored int64
	if err := tx.QueryRowContext(ctx, u.readSQL, resource).Scan(&stored); err != nil {
		return false, err
	}
	return stored == token, nil
}
