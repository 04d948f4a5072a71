package ascend

import (
	"fmt"
	"go.uber.org/goleak"
	"os"
	"path/filepath"
	"testing"

	"github.com/chameleon-go/chameleon/device/internal/fakelib"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// fakes builds the fake runtimes of this test binary, by variant.
var fakes *fakelib.Builder

func TestMain(m *testing.M) {
	b, err := fakelib.New("fakeascendcl")
	if err != nil {
		panic(err)
	}
	fakes = b
	code := m.Run()
	b.Close()
	if code == 0 {
		// No goroutine may outlive the tests (goleak.VerifyTestMain, with
		// the fake libraries' builder closed first).
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildFake compiles testdata/fakeascendcl.c into dir/lib64/libascendcl.so,
// the layout of an ASCEND_HOME_PATH, and returns the library path. It skips
// the test when no C compiler exists.
func buildFake(t testing.TB, variant string, flags ...string) string {
	t.Helper()
	return fakes.Build(t, variant, filepath.Join("testdata", "fakeascendcl.c"), "lib64/libascendcl.so", flags...)
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
	c := &fakeCtl{}
	fakelib.Bind(t, path,
		dl.Func{Ptr: &c.reset, Name: "fake_reset"},
		dl.Func{Ptr: &c.setTotal, Name: "fake_set_total"},
		dl.Func{Ptr: &c.failAllocIn, Name: "fake_fail_alloc_after"},
		dl.Func{Ptr: &c.failNextCopy, Name: "fake_fail_next_copy"},
		dl.Func{Ptr: &c.queryNotReady, Name: "fake_query_not_ready"},
		dl.Func{Ptr: &c.last, Name: "fake_last"},
		dl.Func{Ptr: &c.initialized, Name: "fake_initialized"},
		dl.Func{Ptr: &c.clearContext, Name: "fake_clear_context"},
	)
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
