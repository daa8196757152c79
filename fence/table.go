package fence

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/etcdsync/etcdsync"
)

// Dialect is the SQL dialect of a database: the statements of a [Table] differ by dialect.
type Dialect int

const (
	// Postgres is PostgreSQL 9.5 or later.
	Postgres Dialect = iota + 1
	// MySQL is MySQL 8 or MariaDB 10.5 or later, the table on InnoDB.
	MySQL
	// SQLite is SQLite 3.35 or later.
	SQLite
)

// String returns the dialect's name: "postgres", "mysql" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// DefaultName is the table's name when [NewTable] is given "".
const DefaultName = "etcdsync_fence"

// MaxResource is the longest resource in bytes: a lock's name always fits.
const MaxResource = 512

// The errors of package etcdsync that fence returns, the same values.
var (
	// ErrInvalidOption: bad input to NewTable, Create or Check; nothing was sent.
	ErrInvalidOption = etcdsync.ErrInvalidOption
	// ErrLost: matched by ErrStale.
	ErrLost = etcdsync.ErrLost
)

// ErrStale is the error of a [Table.Check] whose token is lower than one that has already
// written the resource: the caller's hold was lost, and a newer holder wrote. Roll the
// transaction back. errors.Is(err, [ErrLost]) holds too.
var ErrStale error = staleError{}

type staleError struct{}

func (staleError) Error() string        { return "etcdsync/fence: stale token: a newer holder has written" }
func (staleError) Is(target error) bool { return target == ErrLost }

// identifier is a plain SQL identifier that every dialect takes, within PostgreSQL's 63 bytes.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Table is a fence table: a row per resource with the highest token that has written it. It
// holds no connection and is safe for concurrent use.
//
// Only [NewTable] makes a usable Table: the methods of the zero Table and of a nil *Table
// return [ErrInvalidOption] and send nothing.
type Table struct {
	dialect Dialect
	name    string
	sql     statements
}

// NewTable returns the table name (DefaultName if "") in dialect d. The name is quoted in
// the statements, so its case is kept. It does no I/O.
//
// Errors: [ErrInvalidOption], wrapped with the detail, for a dialect that is not one
// of the constants, or a name that is not a plain identifier: an ASCII letter or '_', then
// up to 62 letters, digits or '_' (no schema, no quotes, no spaces).
func NewTable(d Dialect, name string) (*Table, error) {
	if name == "" {
		name = DefaultName
	}
	if !identifier.MatchString(name) {
		return nil, fmt.Errorf("fence: table name %q: %w: a letter or '_', then up to 62 letters, digits or '_'",
			name, ErrInvalidOption)
	}
	var s statements
	switch d {
	case Postgres:
		s = newPostgres(`"` + name + `"`)
	case MySQL:
		s = newMySQL("`" + name + "`")
	case SQLite:
		s = newSQLite(`"` + name + `"`)
	default:
		return nil, fmt.Errorf("fence: %v: %w: not a dialect", d, ErrInvalidOption)
	}
	return &Table{dialect: d, name: name, sql: s}, nil
}

// Name returns the table's name.
func (t *Table) Name() string {
	if t == nil {
		return ""
	}
	return t.name
}

// Dialect returns the table's dialect.
func (t *Table) Dialect() Dialect {
	if t == nil {
		return 0
	}
	return t.dialect
}

// Create creates the table in db unless a table of its name exists (CREATE TABLE IF NOT
// EXISTS). Every replica may call it as it starts, at the same moment.
//
// Errors: [ErrInvalidOption] for a Table that [NewTable] did not make or a nil db,
// having sent nothing; else the database's, wrapped.
//
// Cost: one statement; on PostgreSQL, a transaction of two (an advisory lock of the table's
// name, then the CREATE), since two of its CREATE TABLE IF NOT EXISTS at once can fail.
func (t *Table) Create(ctx context.Context, db *sql.DB) error {
	switch {
	case t == nil || t.sql == nil:
		return fmt.Errorf("fence: create: %w: a Table that NewTable did not make", ErrInvalidOption)
	case db == nil:
		return fmt.Errorf("fence: create %s: %w: nil db", t.name, ErrInvalidOption)
	}
	if err := t.sql.create(ctx, db); err != nil {
		return fmt.Errorf("fence: create %s: %w", t.name, err)
	}
	return nil
}

// Check fences the writes of tx: it raises resource's row to token, or returns [ErrStale] if
// a higher token has written resource, so that tx commits only if no newer holder has
// written before it. Call it inside the transaction that writes the resource, with the token
// of the hold that guards it (mutex.Mutex.Token), then commit; an equal token passes, so a
// holder may write many times. From Check to tx's end, tx holds resource's row locked (on
// SQLite, the database): a Check of it in another transaction waits until then, and a lower
// token then fails.
//
// Errors: [ErrStale], also matching [ErrLost]: roll tx back, the hold was lost.
// [ErrInvalidOption], having sent nothing: a Table that [NewTable] did not make, a
// nil tx, a token below 1, or a resource that is empty, over [MaxResource] bytes, not UTF-8
// or holds a NUL byte. Else the database's error, wrapped, such as a serialization failure
// (PostgreSQL under REPEATABLE READ or SERIALIZABLE, when another transaction checked the
// same resource concurrently), a deadlock or SQLite's busy: roll back, and retry if the hold
// is still held; a retry gets ErrStale once a newer holder has written.
//
// Cost: one statement on PostgreSQL and SQLite, two on MySQL.
func (t *Table) Check(ctx context.Context, tx *sql.Tx, resource string, token int64) error {
	switch {
	case t == nil || t.sql == nil:
		return fmt.Errorf("fence: check: %w: a Table that NewTable did not make", ErrInvalidOption)
	case tx == nil:
		return fmt.Errorf("fence: check %q: %w: nil tx", resource, ErrInvalidOption)
	case token < 1:
		return fmt.Errorf("fence: check %q: %w: token %d, not above 0", resource, ErrInvalidOption, token)
	}
	if err := validResource(resource); err != nil {
		return err
	}
	passed, err := t.sql.check(ctx, tx, resource, token)
	switch {
	case err != nil:
		return fmt.Errorf("fence: check %q at token %d: %w", resource, token, err)
	case !passed:
		return fmt.Errorf("fence: check %q at token %d: %w", resource, token, ErrStale)
	}
	return nil
}

// validResource returns nil for a resource that every dialect's column stores exactly.
func validResource(resource string) error {
	var why string
	switch {
	case resource == "":
		why = "empty"
	case len(resource) > MaxResource:
		why = fmt.Sprintf("%d bytes, over %d", len(resource), MaxResource)
	case !utf8.ValidString(resource):
		why = "not UTF-8"
	case strings.IndexByte(resource, 0) >= 0:
		why = "a NUL byte"
	}
	if why == "" {
		return nil
	}
	if len(resource) > 64 {
		resource = resource[:64] + "..."
	}
	return fmt.Errorf("fence: resource %q: %w: %s", resource, ErrInvalidOption, why)
}
