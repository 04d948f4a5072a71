package ascend

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/chameleon-go/chameleon/device/internal/dl"
)

var (
	fakesMu  sync.Mutex
	fakes    = map[string]string{}
	fakesDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakeascendcl")
	if err != nil {
		panic(err)
	}
	fakesDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildFake compiles testdata/fakeascendcl.c into dir/lib64/libascendcl.so,
// the layout of an ASCEND_HOME_PATH, and returns the library path. It skips
// the test when no C compiler exists.
func buildFake(t testing.TB, variant string, flags ...string) string {
	t.Helper()
	fakesMu.Lock()
	defer fakesMu.Unlock()
	if p, ok := fakes[variant]; ok {
		return p
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the fake libascendcl: %v", cc, err)
	}
	dir := filepath.Join(fakesDir, variant, "lib64")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "libascendcl.so")
	args := append([]string{"-shared", "-fPIC", "-O1", "-o", out}, flags...)
	args = append(args, filepath.Join("testdata", "fakeascendcl.c"))
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("build fake libascendcl: %v\n%s", err, b)
	}
	fakes[variant] = out
	return out
}

type fakeCtl struct {
	reset         func()
	setTotal      func(n int64)
	failAllocIn   func(n int64)
	failNextCopy  func(code int32)
	queryNotReady func(n int32)
	last          func(i int32) int64
	initialized   func() int32
	clearContext  func()
}

// Indices of fake_last, as in fakeascendcl.c.
const (
	lastKind = iota
	lastCount
	lastDestMax
	lastStream
	lastPolicy
	lastMemAttr
	lastInits
	lastFinalizes
	lastAsyncCopies
	lastWaits
	lastResets
	lastDevice
)

func openFake(t testing.TB, path string) *fakeCtl {
	t.Helper()
	lib, err := dl.Open([]string{path}, os.ErrNotExist)
	if err != nil {
		t.Fatal(err)
	}
	c := &fakeCtl{}
	if err := lib.Bind(
		dl.Func{Ptr: &c.reset, Name: "fake_reset"},
		dl.Func{Ptr: &c.setTotal, Name: "fake_set_total"},
		dl.Func{Ptr: &c.failAllocIn, Name: "fake_fail_alloc_after"},
		dl.Func{Ptr: &c.failNextCopy, Name: "fake_fail_next_copy"},
		dl.Func{Ptr: &c.queryNotReady, Name: "fake_query_not_ready"},
		dl.Func{Ptr: &c.last, Name: "fake_last"},
		dl.Func{Ptr: &c.initialized, Name: "fake_initialized"},
		dl.Func{Ptr: &c.clearContext, Name: "fake_clear_context"},
	); err != nil {
		t.Fatal(err)
	}
	c.reset()
	return c
}

func newFake(t testing.TB, opts ...Option) (*Device, *fakeCtl) {
	t.Helper()
	path := buildFake(t, "default")
	ctl := openFake(t, path)
	d, err := New(append([]Option{WithLibrary(path)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return d, ctl
}
