//go:build unix

package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// events is a FIFO that child scripts write lines to ("echo start >"$EV"), read as they come.
type events struct {
	path  string
	f     *os.File
	lines chan string
	done  chan struct{}
}

// newEvents makes the FIFO. It stays open for writing too, so that writers never block and
// readers never see its end.
func newEvents(t *testing.T) *events {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := &events{path: path, f: f, lines: make(chan string, 1000), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			e.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		f.Close()
		<-e.done
	})
	return e
}

// next returns the next event, or fails the test after d.
func (e *events) next(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case s := <-e.lines:
		return s
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
	}
	return ""
}

// none fails the test if an event is there now.
func (e *events) none(t *testing.T, what string) {
	t.Helper()
	select {
	case s := <-e.lines:
		t.Fatalf("%s: unexpected event %q", what, s)
	default:
	}
}

// gates are FIFOs that child scripts wait on (`read _ <"$D/go.$ID"`) until the test opens
// them. The test keeps each open for writing, so that what it writes before a child reads
// waits in the pipe for it.
type gates struct {
	dir string
	mu  sync.Mutex
	fs  map[string]*os.File
}

func newGates(t *testing.T) *gates {
	g := &gates{dir: t.TempDir(), fs: map[string]*os.File{}}
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, f := range g.fs {
			f.Close()
		}
	})
	return g
}

// make creates the gate of id.
func (g *gates) make(t *testing.T, id string) {
	t.Helper()
	path := filepath.Join(g.dir, "go."+id)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.fs[id] = f
	g.mu.Unlock()
}

// open lets the child waiting at gate id go on.
func (g *gates) open(t *testing.T, id string) {
	t.Helper()
	g.mu.Lock()
	f := g.fs[id]
	g.mu.Unlock()
	if _, err := io.WriteString(f, "go\n"); err != nil {
		t.Fatalf("open gate %s: %v", id, err)
	}
}
