//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }

// harness runs the etcdsync binary, built once for the test that owns it, against the
// test cluster.
type harness struct {
	bin string
}

// newHarness builds the binary into t's temporary directory, with the race detector if
// the tests run with it, so that its races are found too.
func newHarness(t *testing.T) *harness {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build etcdsync: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "etcdsync")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goTool, append(args, ".")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return &harness{bin: bin}
}

// environ is the binary's environment: this process's, without ETCDCTL_* and ETCDSYNC_*,
// with ETCDCTL_ENDPOINTS naming the test cluster (so that the variable is tested too), on
// an external cluster ETCDSYNC_NAMESPACE naming the run's prefix, and extra.
func environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCDCTL_") && !strings.HasPrefix(kv, "ETCDSYNC_") {
			env = append(env, kv)
		}
	}
	env = append(env, "ETCDCTL_ENDPOINTS="+strings.Join(cluster.Endpoints(), ","))
	if p := cluster.Prefix(); p != "" {
		env = append(env, "ETCDSYNC_NAMESPACE="+p) // an external cluster: the run's namespace
	}
	return append(env, extra...)
}

// keysOf returns the keys of name (under prefix) in etcd, by create revision.
func keysOf(t *testing.T, cli *clientv3.Client, prefix, name string) []*keyInfo {
	t.Helper()
	resp, err := cli.Get(etcdtest.Context(t), prefix+core.NamePrefix(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var out []*keyInfo
	for _, kv := range resp.Kvs {
		out = append(out, &keyInfo{key: string(kv.Key), rev: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease), value: string(kv.Value)})
	}
	return out
}

type keyInfo struct {
	key   string
	rev   int64
	lease clientv3.LeaseID
	value string
}

// nothingLeft fails the test if a key of name (under prefix) is left in etcd, but a
// semaphore's limit record and marker, which are meant to stay; it deletes those.
func nothingLeft(t *testing.T, cli *clientv3.Client, prefix, name string) {
	t.Helper()
	for _, k := range keysOf(t, cli, prefix, name) {
		if core.IsRecord(strings.TrimPrefix(k.key, prefix+core.NamePrefix(name))) {
			if _, err := cli.Delete(etcdtest.Context(t), k.key); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("key %s left in etcd (lease %x)", k.key, int64(k.lease))
	}
}

// assertOneLine fails the test unless s is exactly one line that starts with prefix.
func assertOneLine(t *testing.T, s, prefix string) {
	t.Helper()
	if strings.Count(s, "\n") != 1 || !strings.HasPrefix(s, prefix) {
		t.Errorf("want one line starting with %q, got:\n%s", prefix, s)
	}
}

// script returns a command line running the shell script body: sh -c body.
func script(body string) []string { return []string{"--", "/bin/sh", "-c", body} }

// alive reports whether pid is a live process: not gone, not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
