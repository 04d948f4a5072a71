// Package testtraces finds the recorded traces the tests run on: the small
// one bundled in testdata/, which is always there, and the public ones in
// ../shared/traces beside the checkout, without which tests skip.
package testtraces

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/chameleon-go/chameleon/trace"
)

// Small is the name of the bundled trace.
const Small = "llama4-small.jsonl.gz"

// Root is the repository root (the directory holding go.mod) above the
// working directory, or "".
func Root() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Dir is ../shared/traces beside the repository root, or "" when absent.
func Dir() string {
	root := Root()
	if root == "" {
		return ""
	}
	p := filepath.Join(root, "..", "shared", "traces")
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return p
	}
	return ""
}

// Bundled is the path of the bundled small trace.
func Bundled(t testing.TB) string {
	t.Helper()
	root := Root()
	if root == "" {
		t.Fatal("no go.mod above the test directory")
	}
	return filepath.Join(root, "testdata", Small)
}

// Path is the path of a trace by file name: one in testdata/ (Small and
// the others recorded there), else the public one, skipping the test when
// it is not there.
func Path(t testing.TB, name string) string {
	t.Helper()
	if name == Small {
		return Bundled(t)
	}
	if root := Root(); root != "" {
		if p := filepath.Join(root, "testdata", name); fileExists(p) {
			return p
		}
	}
	dir := Dir()
	if dir == "" {
		t.Skipf("%s: ../shared/traces is not beside the checkout", name)
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s: %v", name, err)
	}
	return p
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

var (
	mu    sync.Mutex
	cache = map[string]*trace.Trace{}
)

// Read reads a trace by file name (see Path), once per test binary: the
// traces are read-only to the tests.
func Read(t testing.TB, name string) *trace.Trace {
	t.Helper()
	p := Path(t, name)
	mu.Lock()
	defer mu.Unlock()
	if tr, ok := cache[p]; ok {
		return tr
	}
	tr, err := trace.ReadFile(p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	cache[p] = tr
	return tr
}
