//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to write it")
	assert.Equal(t, string(want), got, "%s differs; run with -update to rewrite it", path)
}

// normalizer makes status output comparable from run to run: it names the leases L1, L2, ...
// and the tokens T1, T2, ... in the order etcd created them, shows TTLs as <ttl>, and this
// host, pid and the times of now as HOST, PID, SINCE.
type normalizer struct {
	leases      *strings.Replacer
	leasePairs  []string // hex, name, ...
	seen        map[clientv3.LeaseID]bool
	tokens      map[string]string
	host        string
	pid         string
	uuid, stamp *regexp.Regexp
}

func newNormalizer(t *testing.T, cli *clientv3.Client, names []string) *normalizer {
	host, _ := os.Hostname()
	n := &normalizer{
		tokens: map[string]string{},
		seen:   map[clientv3.LeaseID]bool{},
		host:   host,
		pid:    strconv.Itoa(os.Getpid()),
		uuid:   regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`),
		stamp:  regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`),
	}
	var all []*keyInfo
	for _, name := range names {
		all = append(all, keysOf(t, cli, "", name)...)
	}
	n.name(all)
	return n
}

// add names the tokens and leases of the keys under prefix too.
func (n *normalizer) add(t *testing.T, cli *clientv3.Client, prefix string) {
	resp, err := cli.Get(etcdtest.Context(t), prefix, clientv3.WithPrefix())
	require.NoError(t, err)
	var all []*keyInfo
	for _, kv := range resp.Kvs {
		all = append(all, &keyInfo{key: string(kv.Key), rev: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease)})
	}
	n.name(all)
}

// name gives the keys' tokens and new leases the next names, in the order etcd created them.
func (n *normalizer) name(keys []*keyInfo) {
	slices.SortFunc(keys, func(a, b *keyInfo) int { return int(a.rev - b.rev) })
	for _, k := range keys {
		n.tokens[strconv.FormatInt(k.rev, 10)] = fmt.Sprintf("T%d", len(n.tokens)+1)
		if k.lease != 0 && !n.seen[k.lease] {
			n.seen[k.lease] = true
			n.leasePairs = append(n.leasePairs, fmt.Sprintf("%x", int64(k.lease)), fmt.Sprintf("L%d", len(n.seen)))
		}
	}
	n.leases = strings.NewReplacer(n.leasePairs...)
}

// token is the name of a token, or "T?" for one that no key of the names had.
func (n *normalizer) token(rev string) string {
	if name, ok := n.tokens[rev]; ok {
		return name
	}
	return "T?"
}

// owner normalizes an owner's text or a key's value.
func (n *normalizer) owner(s string) string {
	s = n.uuid.ReplaceAllString(s, "UUID")
	s = n.stamp.ReplaceAllStringFunc(s, func(stamp string) string {
		if at, err := time.Parse(time.RFC3339, stamp); err == nil && time.Since(at).Abs() < time.Hour {
			return "SINCE"
		}
		return stamp
	})
	for _, pid := range []string{"pid " + n.pid, "pid=" + n.pid} {
		s = strings.ReplaceAll(s, pid, pid[:4]+"PID")
	}
	if n.host != "" {
		s = regexp.MustCompile(`(^|[ =])`+regexp.QuoteMeta(n.host)+`( |$)`).ReplaceAllString(s, "${1}HOST$2")
	}
	return s
}

// text normalizes status's text: each table row field by field, whitespace as one space.
func (n *normalizer) text(out string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		f := strings.Fields(line)
		if strings.HasPrefix(line, "  ") && len(f) >= 8 && f[0] != "POS" { // a row of a queue
			f[3] = n.leases.Replace(f[3])
			f[4] = n.token(f[4])
			f[5] = n.leases.Replace(f[5])
			if strings.HasSuffix(f[6], "s") {
				f[6] = "<ttl>"
			}
			f = append(f[:7], n.owner(strings.Join(f[7:], " ")))
		}
		b.WriteString(strings.Join(f, " ") + "\n")
	}
	return b.String()
}

// json normalizes status's JSON, and indents it.
func (n *normalizer) json(out string) string {
	var snap map[string]any
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		return fmt.Sprintf("not JSON (%v):\n%s", err, out)
	}
	snap["revision"] = "REV"
	for _, ns := range snap["names"].([]any) {
		for _, e := range ns.(map[string]any)["queue"].([]any) {
			e := e.(map[string]any)
			e["key"] = n.leases.Replace(e["key"].(string))
			e["token"] = n.token(strconv.FormatFloat(e["token"].(float64), 'f', -1, 64))
			if l, ok := e["lease"].(string); ok {
				e["lease"] = n.leases.Replace(l)
			}
			if _, ok := e["ttl"]; ok {
				e["ttl"] = "<ttl>"
			}
			e["value"] = n.owner(e["value"].(string))
			if owner, ok := e["owner"].(map[string]any); ok {
				for k, v := range owner {
					owner[k] = n.owner(k + "=" + v.(string))[len(k)+1:]
				}
			}
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(snap); err != nil {
		return err.Error()
	}
	return b.String()
}
