// Package fence checks a hold's fencing token where the work lands: in the caller's own SQL
// transaction, so that what a holder writes commits only if no newer holder has written.
//
// A lock is not a fence: a process that pauses after taking a lock (GC, swap, a stopped VM)
// can wake after its hold was lost and a successor wrote, with nothing to tell it in time.
// Its late writes must then fail, and [Table.Check] makes them fail. A table row per resource
// keeps the highest token that has written the resource; Check, inside the transaction that
// writes it, raises the row to the caller's token, or returns [ErrStale] when a higher token
// has written. From the check to the commit the row stays locked, so a lower token checked
// meanwhile waits for that commit and then fails. An equal token passes: a holder writes many
// times.
//
// The token is a hold's Token (mutex.Mutex.Token, and the same on every primitive's hold):
// it increases strictly across the successive holders of a name. The resource is what the hold
// guards, often the lock's name.
//
// The package uses database/sql alone and brings no driver: open the database with the driver
// of your choice. Dialects: PostgreSQL, MySQL 8 and MariaDB 10.5 or later (InnoDB), SQLite
// 3.35 or later. Only the table name, checked to be a plain identifier, is written into SQL;
// resources and tokens are bind parameters.
//
// See Example for a holder's late write refused, examples/fenced-sql for a program, and
// docs/fencing.md for the same check from a shell and where fencing cannot help.
package fence
