package core

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// processOwner names this process: "host=H pid=P".
var processOwner = sync.OnceValue(func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("host=%s pid=%d", host, os.Getpid())
})

// OwnerValue is the value of an acquisition's key, written in the same Txn at no extra
// cost, so that `etcdctl get` and `etcdsync status` show who holds or waits and since when:
// "host=H pid=P since=T", T in RFC 3339, UTC, to the second; extra, if not empty, follows
// (" owner=<uuid>").
func OwnerValue(extra string) string {
	v := processOwner() + " since=" + time.Now().UTC().Format(time.RFC3339)
	if extra != "" {
		v += " " + extra
	}
	return v
}
