package cuda

import (
	"fmt"
	"go.uber.org/goleak"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chameleon-go/chameleon/device/internal/fakelib"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// fakes caches the fake runtimes built in this test binary, by variant.
// fakes builds the fake runtimes of this test binary, by variant.
var fakes *fakelib.Builder

func TestMain(m *testing.M) {
	b, err := fakelib.New("fakecudart")
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

// buildFake compiles testdata/fakecudart.c with extra flags into a shared
// library and returns its path. It skips the test when no C compiler exists.
func buildFake(t testing.TB, variant string, flags ...string) string {
	t.Helper()
	return fakes.Build(t, variant, filepath.Join("testdata", "fakecudart.c"), "libcudart-"+variant+".so", flags...)
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

	// The driver part (absent from the -DOMIT_DRIVER and -DOMIT_VMM variants).
	setGranularity func(n int64)
	failCreateIn   func(n int64)
	failMapIn      func(n int64, code int32)
	vmmCount       func(i int32) int64
	liveHandles    func() int64
	mappedBytes    func() int64
	reservations   func() int64
	netPushes      func() int64
	used           func() int64
	retained       func(dev int32) int32
}

// Indices of fake_vmm_count, as in fakecudart.c.
const (
	vmmCreates = iota
	vmmMaps
	vmmUnmaps
	vmmReleases
	vmmAccess
	vmmReserves
	vmmFrees
)

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
	c := &fakeCtl{}
	lib := fakelib.Bind(t, path,
		dl.Func{Ptr: &c.reset, Name: "fake_reset"},
		dl.Func{Ptr: &c.setTotal, Name: "fake_set_total"},
		dl.Func{Ptr: &c.failAllocIn, Name: "fake_fail_alloc_after"},
		dl.Func{Ptr: &c.failNextCopy, Name: "fake_fail_next_copy"},
		dl.Func{Ptr: &c.queryNotReady, Name: "fake_query_not_ready"},
		dl.Func{Ptr: &c.last, Name: "fake_last"},
		dl.Func{Ptr: &c.liveAllocs, Name: "fake_live_allocs"},
	)
	// Variants without the driver calls leave these nil.
	_ = lib.Bind(
		dl.Func{Ptr: &c.setGranularity, Name: "fake_set_granularity"},
		dl.Func{Ptr: &c.failCreateIn, Name: "fake_fail_create_after"},
		dl.Func{Ptr: &c.failMapIn, Name: "fake_fail_map_after"},
		dl.Func{Ptr: &c.vmmCount, Name: "fake_vmm_count"},
		dl.Func{Ptr: &c.liveHandles, Name: "fake_live_handles"},
		dl.Func{Ptr: &c.mappedBytes, Name: "fake_mapped_bytes"},
		dl.Func{Ptr: &c.reservations, Name: "fake_reservations"},
		dl.Func{Ptr: &c.netPushes, Name: "fake_net_pushes"},
		dl.Func{Ptr: &c.used, Name: "fake_used"},
		dl.Func{Ptr: &c.retained, Name: "fake_retained"},
	)
	c.reset()
	return c
}

// newFake returns a device on a freshly reset default fake, which is
// its libcuda too: the device maps pages (2 MiB unless the test changes
// the fake's granularity first).
func newFake(t testing.TB, opts ...Option) (*Device, *fakeCtl) {
	t.Helper()
	path := buildFake(t, "default")
	ctl := openFake(t, path)
	d, err := New(append([]Option{WithLibrary(path), WithDriverLibrary(path)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(d.Library(), "libcudart-default.so") {
		t.Fatalf("loaded %s, want the fake", d.Library())
	}
	return d, ctl
}
