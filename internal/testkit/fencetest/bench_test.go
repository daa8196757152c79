package fencetest

import (
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// BenchmarkCheck measures a transaction that updates one row, alone and with a Check
// before the update, one after another on one connection, on each database. The difference
// is what the fence costs; tx/s is the rate of transactions. The servers run without fsync
// unless ETCDSYNC_SQL_FSYNC is set (docs/performance.md has figures of both).
//
//	go test -run '^$' -bench Check -benchtime 3000x ./internal/testkit/fencetest
func BenchmarkCheck(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			db := be.newDatabase(b)
			db.SetMaxOpenConns(1)
			ctx := etcdtest.Context(b)
			table := table(b, db, "")
			if _, err := db.ExecContext(ctx, "CREATE TABLE counter (id INT PRIMARY KEY, n BIGINT NOT NULL)"); err != nil {
				b.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO counter (id, n) VALUES (1, 0)"); err != nil {
				b.Fatal(err)
			}
			b.Logf("%s %s", be.name, be.version)
			writes := 0 // tokens rise across -count's runs: a new holder every 100 writes
			for _, fenced := range []bool{false, true} {
				name := "transaction"
				if fenced {
					name = "fenced"
				}
				b.Run(name, func(b *testing.B) {
					start := time.Now()
					for b.Loop() {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							b.Fatal(err)
						}
						if fenced {
							if err := table.Check(ctx, tx, "job", int64(1+writes/100)); err != nil {
								b.Fatal(err)
							}
							writes++
						}
						if _, err := tx.ExecContext(ctx, "UPDATE counter SET n = n + 1 WHERE id = 1"); err != nil {
							b.Fatal(err)
						}
						if err := tx.Commit(); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
				})
			}
		})
	}
}
