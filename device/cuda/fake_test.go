package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chameleon-go/chameleon/device/internal/dl"
)

// fakes caches the fake runtimes built in this test binary, by variant.
var (
	fakesMu  sync.Mutex
	fakes    = map[string]string{}
	fakesDir string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakecudart")
	if err != nil {
		panic(err)
	}
	fakesDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildFake compiles testdata/fakecudart.c with extra flags into a shared
// library and returns its path. It skips the test when no C compiler exists.
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
		t.Skipf("no C compiler (%s) to build the fake libcudart: %v", cc, err)
	}
	out := filepath.Join(fakesDir, "libcudart-"+variant+".so")
	args := append([]string{"-shared", "-fPIC", "-O1", "-o", out}, flags...)
	args = append(args, filepath.Join("testdata", "fakecudart.c"))
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("build fake libcudart: %v\n%s", err, b)
	}
	fakes[variant] = out
	return out
}

// fakeCtl drives the fake's test hooks through purego.
type fakeCtl struct {
	reset         func()
	setTotal      func(n int64)
	failAllocIn   func(n int64)
	failNextCopy  func(code int32)
	queryNotReady func(n int32)
	last          func(i int32) int64
	liveAllocs    func() int64
}

// Indices of fake_last, as in fakecudart.c.
const (
	lastKind = iota
	lastCount
	lastStream
	lastHostFlags
	lastStreamFlags
	lastEventFlags
	lastDevice
	lastAsyncCopies
	lastWaits
	lastWaitFlags
	lastRecords
	lastSyncCopies
	lastDeviceSyncs
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
		dl.Func{Ptr: &c.liveAllocs, Name: "fake_live_allocs"},
	); err != nil {
		t.Fatal(err)
	}
	c.reset()
	return c
}

// newFake returns a device on a freshly reset default fake.
func newFake(t testing.TB, opts ...Option) (*Device, *fakeCtl) {
	t.Helper()
	path := buildFake(t, "default")
	ctl := openFake(t, path)
	d, err := New(append([]Option{WithLibrary(path)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(d.Library(), "libcudart-default.so") {
		t.Fatalf("loaded %s, want the fake", d.Library())
	}
	return d, ctl
}
