// Package exampletest runs the Examples of the library's packages on a real etcd, so that
// what their godoc shows cannot rot. The library's module has no etcd server: its packages
// skip their Examples unless ETCDSYNC_EXAMPLE_ENDPOINTS names an etcd, which this test sets
// to a member it embeds; nor a SQL driver, which it links into the test binaries of the
// packages whose Examples open a database (see sqlDrivers).
package exampletest

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// endpointsVariable is where the Examples look for etcd (see exampleEndpoints in each
// package's example_test.go).
const endpointsVariable = "ETCDSYNC_EXAMPLE_ENDPOINTS"

var cluster *etcdtest.Cluster

// TestMain starts a member of the test's own, also when ETCD_ENDPOINTS names a cluster: the
// Examples write under the names a reader would use, not inside a run's namespace.
func TestMain(m *testing.M) {
	etcdtest.MainWith(m, &cluster, func() (*etcdtest.Cluster, error) { return etcdtest.NewEmbedded(1) })
}

// TestExamplesRunAndLeaveNoKey: every public package of the library has an Example, and
// each Example has an output to check (else go test only compiles it), passes on the
// embedded member, and leaves no key there. A package's Examples run one after another, and
// the packages one at a time, so that Examples may use the same names.
func TestExamplesRunAndLeaveNoKey(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	pkgs := libraryPackages(t, root)
	require.NotEmpty(t, pkgs)
	bins := buildTests(t, root, pkgs)
	cli := cluster.Client(t)
	for _, p := range pkgs {
		t.Run(p.name, func(t *testing.T) {
			examples := examplesOf(t, p)
			require.NotEmpty(t, examples, "%s has no Example", p.importPath)
			out := runTest(t, bins, p, "-test.run", "^Example", "-test.v", "-test.count", "1", "-test.timeout", "1m")
			for _, ex := range examples {
				name := "Example" + ex.Name
				if !assert.True(t, ex.Output != "" || ex.EmptyOutput,
					"%s.%s has no // Output: comment, so go test only compiles it", p.name, name) {
					continue
				}
				assert.Regexp(t, "--- PASS: "+regexp.QuoteMeta(name)+" ", out, "%s.%s did not pass", p.name, name)
			}
			assertNoKeys(t, cli)
		})
	}
}

// examplesOf returns the Examples in p's test files.
func examplesOf(t *testing.T, p pkg) []*doc.Example {
	names, err := filepath.Glob(filepath.Join(p.dir, "*_test.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	return doc.Examples(files...)
}

// pkg is one package of the library.
type pkg struct{ importPath, name, dir string }

// libraryPackages lists the library module's packages outside internal/.
func libraryPackages(t *testing.T, root string) []pkg {
	out := goCommand(t, root, "list", "-f", "{{.ImportPath}}\t{{.Name}}\t{{.Dir}}", "./...")
	var pkgs []pkg
	for line := range strings.Lines(out) {
		f := strings.Split(strings.TrimSpace(line), "\t")
		require.Len(t, f, 3, "go list: %q", line)
		if !strings.Contains(f[0], "/internal/") {
			pkgs = append(pkgs, pkg{importPath: f[0], name: f[1], dir: f[2]})
		}
	}
	return pkgs
}

// buildTests builds the test binaries of pkgs into a directory and returns it: each binary
// is <package name>.test there. Linking ten binaries is most of this test's time, so they
// have no symbol tables or DWARF, and no race detector (which makes the links half as long
// again): the library's races are looked for by internal/testkit's own packages.
func buildTests(t *testing.T, root string, pkgs []pkg) string {
	dir := t.TempDir()
	args := []string{"test", "-c", "-o", dir, "-ldflags=-s -w", "-overlay", driversOverlay(t, root, dir)}
	for _, p := range pkgs {
		args = append(args, p.importPath)
	}
	goCommand(t, root, args...)
	return dir
}

// sqlDrivers are the SQL drivers that Examples open, each a file in testdata that imports
// one, by the library package whose test binary it is laid into: the library's module
// requires no driver (package fence uses database/sql alone), and this module requires them.
var sqlDrivers = map[string]string{"fence": "sqlite_driver.go"}

// driversOverlay writes, into dir, a go build overlay that adds each of sqlDrivers to its
// package's test files, and returns its path.
func driversOverlay(t *testing.T, root, dir string) string {
	replace := map[string]string{}
	for pkgDir, file := range sqlDrivers {
		src, err := filepath.Abs(filepath.Join("testdata", file))
		require.NoError(t, err)
		replace[filepath.Join(root, pkgDir, "example_driver_test.go")] = src
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	require.NoError(t, err)
	path := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(path, overlay, 0o644))
	return path
}

// runTest runs p's test binary from bins in p's directory, with the member's endpoints in
// endpointsVariable, and returns its output; it fails t with the output if the binary fails.
func runTest(t *testing.T, bins string, p pkg, args ...string) string {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bins, p.name+".test"), args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), endpointsVariable+"="+strings.Join(cluster.Endpoints(), ","))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", p.importPath, strings.Join(args, " "), out)
	return string(out)
}

// goCommand runs the go command in dir and returns its standard output; it fails t with the
// command's output if it fails.
func goCommand(t *testing.T, dir string, args ...string) string {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command, to build the Examples")
	cmd := exec.CommandContext(t.Context(), goTool, args...)
	cmd.Dir = dir
	// The Examples are built in the repository's workspace, whatever this test runs under
	// (GOWORK=off and a -modfile in CI's tier of the lowest versions): the SQL driver that
	// an Example opens is required by this module, not by the library's.
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), stderr.String())
	return string(out)
}

// assertNoKeys fails t if etcd holds any key, naming them, and then deletes them so that
// the next package's Examples start from an empty etcd.
func assertNoKeys(t *testing.T, cli *clientv3.Client) {
	ctx := etcdtest.Context(t)
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	t.Errorf("the Examples left keys in etcd: %q", keys)
	_, err = cli.Delete(ctx, "", clientv3.WithPrefix())
	require.NoError(t, err)
}
