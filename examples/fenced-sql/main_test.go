package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(holderVariable) != "" {
		main() // holder A, in this test binary
		return
	}
	goleak.VerifyTestMain(m)
}

// The program as `go run ./examples/fenced-sql` runs it: SQLite, an embedded etcd; run
// fails if holder A's late write lands or A fails.
func TestAPausedHoldersLateWriteIsRefused(t *testing.T) {
	etcdtest.OwnMembers(t) // its own embedded etcd, never ETCD_ENDPOINTS'
	if err := run("", ""); err != nil {
		t.Fatal(err)
	}
}
