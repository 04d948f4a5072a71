// Package fakelib builds, for the binding tests, the stand-in C libraries
// (a fake libcudart, a fake libascendcl) that implement the runtime's
// symbols over host memory, once per variant of compiler flags.
package fakelib

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/chameleon-go/chameleon/internal/dl"
)

// Builder compiles C sources into shared libraries under a temporary
// directory and caches them by variant for the life of the test binary.
type Builder struct {
	mu    sync.Mutex
	dir   string
	built map[string]string
}

// New makes a builder whose libraries live in a fresh temporary directory;
// Close removes it.
func New(prefix string) (*Builder, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	return &Builder{dir: dir, built: map[string]string{}}, nil
}

// Close removes the built libraries.
func (b *Builder) Close() error { return os.RemoveAll(b.dir) }

// Build compiles src with flags into <dir>/<variant>/<rel> (rel may hold
// directories, to mimic an installation layout) and returns the library's
// path. It skips the test when there is no C compiler ($CC, else cc).
func (b *Builder) Build(t testing.TB, variant, src, rel string, flags ...string) string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.built[variant]; ok {
		return p
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build %s: %v", cc, filepath.Base(src), err)
	}
	out := filepath.Join(b.dir, variant, rel)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-O1", "-o", out}, flags...)
	args = append(args, src)
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", filepath.Base(src), err, msg)
	}
	b.built[variant] = out
	return out
}

// TimingCtl drives a fake library's event clock and its elapsed-time
// faults (both fakes export the same three symbols).
type TimingCtl struct {
	// Advance moves the fake device's clock by ns nanoseconds.
	Advance func(ns int64)
	// NotReady makes the next n elapsed-time calls report "not complete".
	NotReady func(n int32)
	// FailElapsed makes the next elapsed-time call fail with code.
	FailElapsed func(code int32)
}

// Bind opens the fake library at path and binds fns, failing t when it
// cannot; the library is returned for symbols only some variants have.
func Bind(t testing.TB, path string, fns ...dl.Func) *dl.Library {
	t.Helper()
	lib, err := dl.Open([]string{path}, os.ErrNotExist)
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Bind(fns...); err != nil {
		t.Fatal(err)
	}
	return lib
}

// OpenTiming binds the timing controls of the fake library at path.
func OpenTiming(t testing.TB, path string) *TimingCtl {
	t.Helper()
	c := &TimingCtl{}
	Bind(t, path,
		dl.Func{Ptr: &c.Advance, Name: "fake_advance_clock"},
		dl.Func{Ptr: &c.NotReady, Name: "fake_elapsed_not_ready"},
		dl.Func{Ptr: &c.FailElapsed, Name: "fake_fail_next_elapsed"},
	)
	return c
}
