//go:build unix

package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// testOtherKindAndDelete: a name a semaphore used once keeps its limit record; a lock of it
// then exits 64 at once, naming the record, where it used to wait for good (and status
// called it a semaphore nobody holds). delete refuses while a permit holds (exit 1, naming
// its key), removes the record once nobody does, and the lock then runs.
func testOtherKindAndDelete(t *testing.T, h *harness) {
	const name = "cmd-other-kind"
	cli := cluster.Client(t)
	p := h.run(t, environ(), "sem", "-n", "2", name, "--", "true")
	require.Equal(t, exitOK, p.code, p.stderr.text())

	for _, args := range [][]string{{"lock", "--timeout", "20s", name, "--", "true"}, {"elect", "--timeout", "20s", name, "v", "--", "true"},
		{"rlock", "--timeout", "20s", name, "--", "true"}} {
		p = h.run(t, environ(), args...)
		assert.Equal(t, exitUsage, p.code, "%v: %s", args, p.stderr.text())
		assertOneLine(t, p.stderr.text(), "etcdsync "+args[0]+": ")
		assert.Contains(t, p.stderr.text(), core.NamePrefix(name)+core.RecordLimit, "%v names the record", args)
		assert.Contains(t, p.stderr.text(), "etcdsync delete")
	}

	holder := h.start(t, environ(), "sem", "-n", "2", name, "--", "sleep", "600")
	etcdtest.AwaitKeys(t, cli, core.NamePrefix(name)+core.KindPermit, 1)
	p = h.run(t, environ(), "delete", name)
	assert.Equal(t, exitFree, p.code, p.stderr.text())
	assertOneLine(t, p.stderr.text(), "etcdsync delete: ")
	assert.Contains(t, p.stderr.text(), core.NamePrefix(name)+core.KindPermit)
	assert.Contains(t, p.stderr.text(), "nothing deleted")
	holder.signal(syscall.SIGTERM)
	holder.wait(30 * time.Second)

	p = h.run(t, environ(), "delete", name, name+"-never-used")
	assert.Equal(t, exitOK, p.code, p.stderr.text())
	assert.Zero(t, etcdtest.CountKeys(t, cli, core.NamePrefix(name)))
	p = h.run(t, environ(), "lock", name, "--", "true")
	assert.Equal(t, exitOK, p.code, p.stderr.text())
	nothingLeft(t, cli, "", name)

	p = h.run(t, environ(), "delete")
	assert.Equal(t, exitUsage, p.code, p.stderr.text())
}

// testEtcdLayout: --etcd-layout puts a name with '/' where etcd's concurrency.Mutex (and
// etcdctl lock) put it: while etcd's Mutex holds "/my-lock/", lock --try of it is busy (75);
// without --etcd-layout it is another name; status --etcd-layout shows etcd's holder.
func testEtcdLayout(t *testing.T, h *harness) {
	const name = "/cmd-my-lock/"
	ctx := etcdtest.Context(t)
	s, err := concurrency.NewSession(cluster.Client(t))
	require.NoError(t, err)
	defer s.Close()
	theirs := concurrency.NewMutex(s, name)
	require.NoError(t, theirs.Lock(ctx))

	p := h.run(t, environ(), "lock", "--try", "--etcd-layout", name, "--", "true")
	assert.Equal(t, exitBusy, p.code, p.stderr.text())
	p = h.run(t, environ(), "lock", "--try", name, "--", "true")
	assert.Equal(t, exitOK, p.code, "the escaped name is another: %s", p.stderr.text())
	p = h.run(t, environ(), "status", "--etcd-layout", "--json", name)
	assert.Equal(t, exitOK, p.code, p.stderr.text())
	assert.Contains(t, p.stdout.text(), theirs.Key())

	done := make(chan error, 1)
	waiter := h.start(t, environ(), "lock", "--etcd-layout", name, "--", "true")
	etcdtest.AwaitKeys(t, cluster.Client(t), name+"/", 2)
	go func() { done <- theirs.Unlock(context.Background()) }()
	require.NoError(t, <-done)
	assert.Equal(t, exitOK, waiter.wait(30*time.Second), waiter.stderr.text())
	assert.Zero(t, etcdtest.CountKeys(t, cluster.Client(t), name+"/"))
}
