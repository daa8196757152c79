// Package shapetest holds the shape of internal/core to what issue 54 asked of it: few files,
// none long, each idea in one, and few uses that run against the layering that core/doc.go's
// map states. It reads the source only; it starts no etcd.
//
// Run it with -v to print the figures: go test -v -run TestCoreShape ./shapetest (in
// internal/testkit).
package shapetest

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The bounds the core keeps. maxLines, maxAgainstDoc and maxCycle are ratchets: lower them
// as the core improves (issue 54 asks for 8,400 lines).
const (
	maxFiles      = 24
	maxFileLines  = 600
	maxLines      = 10322
	maxAgainstDoc = 20 // uses of a file that doc.go's map lists after the user's (113 before the regroup)
	maxCycle      = 19 // files in the largest cycle of uses (29 before the regroup)
)

func TestCoreShape(t *testing.T) {
	s, err := measure(filepath.Join("..", "..", "core"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d files, %d lines; %d uses between files (file pairs); %d against doc.go's order, "+
		"%d against the best order found; the largest cycle holds %d files",
		len(s.files), s.total, len(s.uses), len(s.againstDoc), s.againstBest, s.cycle)
	for _, f := range s.files {
		t.Logf("  %-22s %4d lines", f, s.lines[f])
	}
	for _, u := range s.againstDoc {
		t.Logf("  against doc.go's order: %s", u)
	}
	if len(s.files) > maxFiles {
		t.Errorf("core has %d files, more than %d", len(s.files), maxFiles)
	}
	for _, f := range s.files {
		if s.lines[f] > maxFileLines {
			t.Errorf("%s has %d lines, more than %d", f, s.lines[f], maxFileLines)
		}
	}
	if s.total > maxLines {
		t.Errorf("core has %d lines, more than %d", s.total, maxLines)
	}
	if len(s.againstDoc) > maxAgainstDoc {
		t.Errorf("%d uses run against doc.go's order, more than %d", len(s.againstDoc), maxAgainstDoc)
	}
	if s.cycle > maxCycle {
		t.Errorf("the largest cycle of uses holds %d files, more than %d", s.cycle, maxCycle)
	}
	for _, f := range s.unlisted {
		t.Errorf("%s is not in doc.go's map", f)
	}
	for _, f := range s.stale {
		t.Errorf("doc.go's map lists %s, which is not a file of core", f)
	}
}

type shape struct {
	files       []string       // the non-test files, by name
	lines       map[string]int // by file
	total       int
	uses        map[[2]string]bool // user, used
	order       []string           // doc.go's map, from the ground up
	againstDoc  []string           // "a.go -> b.go (names)"
	againstBest int
	cycle       int
	unlisted    []string
	stale       []string
}

// measure reads the package in dir: its files, their lines, and which file uses what another
// declares (a package-level name, a method or a field), by go/types over the package alone
// (imports are left empty: only the package's own names are resolved).
func measure(dir string) (*shape, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	s := &shape{lines: map[string]int{}, uses: map[[2]string]bool{}}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		base := filepath.Base(n)
		s.files = append(s.files, base)
		s.lines[base] = fset.File(f.Pos()).LineCount()
		s.total += s.lines[base]
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: emptyImporter{}, Error: func(error) {}}
	pkg, _ := conf.Check("core", fset, files, info) // errors: the imports' names, unresolved
	why := map[[2]string]map[string]bool{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			continue // a local name
		}
		user := filepath.Base(fset.Position(id.Pos()).Filename)
		used := filepath.Base(fset.Position(obj.Pos()).Filename)
		if user == used {
			continue
		}
		k := [2]string{user, used}
		s.uses[k] = true
		if why[k] == nil {
			why[k] = map[string]bool{}
		}
		why[k][obj.Name()] = true
	}
	s.order, err = docOrder(filepath.Join(dir, "doc.go"))
	if err != nil {
		return nil, err
	}
	at := map[string]int{}
	for i, f := range s.order {
		at[f] = i
		if s.lines[f] == 0 {
			s.stale = append(s.stale, f)
		}
	}
	for _, f := range s.files {
		if _, ok := at[f]; !ok && f != "doc.go" {
			s.unlisted = append(s.unlisted, f)
		}
	}
	for k := range s.uses {
		i, ok1 := at[k[0]]
		j, ok2 := at[k[1]]
		if ok1 && ok2 && j > i {
			var ns []string
			for n := range why[k] {
				ns = append(ns, n)
			}
			sort.Strings(ns)
			s.againstDoc = append(s.againstDoc, fmt.Sprintf("%s -> %s (%s)", k[0], k[1], strings.Join(ns, ", ")))
		}
	}
	sort.Strings(s.againstDoc)
	s.againstBest = backArcs(s.files, s.uses)
	s.cycle = largestCycle(s.files, s.uses)
	return s, nil
}

type emptyImporter struct{}

func (emptyImporter) Import(path string) (*types.Package, error) {
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}

// docOrder reads the files doc.go's map names, in its order: lines "//   - a.go: ..." or
// "//   - a.go, b.go: ...".
func docOrder(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	item := regexp.MustCompile(`^//\s+- ([a-z0-9_]+\.go(?:, [a-z0-9_]+\.go)*):`)
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := item.FindStringSubmatch(sc.Text()); m != nil {
			order = append(order, strings.Split(m[1], ", ")...)
		}
	}
	return order, sc.Err()
}

// backArcs orders the files by the heuristic of Eades, Lin and Smyth (sinks last, sources
// first, else the file whose uses most exceed its users) and counts the uses that run from
// a file to one placed before it: an order-free measure of the uses against any layering.
func backArcs(files []string, uses map[[2]string]bool) int {
	left := map[string]bool{}
	for _, f := range files {
		left[f] = true
	}
	deg := func(f string) (in, out int) {
		for k := range uses {
			if k[0] == f && left[k[1]] {
				out++
			}
			if k[1] == f && left[k[0]] {
				in++
			}
		}
		return
	}
	var head, tail []string // head: used by nothing left... placed from the top
	for len(left) > 0 {
		changed := true
		for changed {
			changed = false
			for _, f := range sorted(left) {
				if in, _ := deg(f); in == 0 { // no one left uses f: it goes on top
					head = append(head, f)
					delete(left, f)
					changed = true
				} else if _, out := deg(f); out == 0 { // f uses no one left: ground
					tail = append([]string{f}, tail...)
					delete(left, f)
					changed = true
				}
			}
		}
		if len(left) == 0 {
			break
		}
		best, bestD := "", -1<<30
		for _, f := range sorted(left) {
			in, out := deg(f)
			if out-in > bestD {
				best, bestD = f, out-in
			}
		}
		head = append(head, best)
		delete(left, best)
	}
	pos := map[string]int{}
	for i, f := range append(head, tail...) {
		pos[f] = i
	}
	n := 0
	for k := range uses {
		if pos[k[1]] < pos[k[0]] {
			n++
		}
	}
	return n
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// largestCycle is the size of the largest set of files that all reach each other by uses.
func largestCycle(files []string, uses map[[2]string]bool) int {
	reach := func(from string) map[string]bool {
		seen := map[string]bool{from: true}
		stack := []string{from}
		for len(stack) > 0 {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for k := range uses {
				if k[0] == f && !seen[k[1]] {
					seen[k[1]] = true
					stack = append(stack, k[1])
				}
			}
		}
		return seen
	}
	r := map[string]map[string]bool{}
	for _, f := range files {
		r[f] = reach(f)
	}
	best := 0
	for _, f := range files {
		n := 0
		for _, g := range files {
			if r[f][g] && r[g][f] {
				n++
			}
		}
		if n > 1 && n > best {
			best = n
		}
	}
	return best
}
