package nccl

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/fakelib"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// fakes builds the fake libraries of this test binary, by variant.
var fakes *fakelib.Builder

func TestMain(m *testing.M) {
	b, err := fakelib.New("fakenccl")
	if err != nil {
		panic(err)
	}
	fakes = b
	code := m.Run()
	b.Close()
	if code == 0 {
		// No goroutine may outlive the tests.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildFake compiles testdata/fakenccl.c with extra flags and returns the
// library's path. It skips the test when no C compiler exists.
func buildFake(t testing.TB, variant string, flags ...string) string {
	t.Helper()
	return fakes.Build(t, variant, filepath.Join("testdata", "fakenccl.c"), "libnccl-"+variant+".so.2",
		append([]string{"-pthread"}, flags...)...)
}

// fakeCtl drives the fake's test hooks.
type fakeCtl struct {
	reset         func()
	failNext      func(call string, code int32)
	setAsyncError func(comm uintptr, code int32)
	lastInitKind  func() int32
	lastID        func(out *UniqueID)
	liveComms     func() int32
	liveAllocs    func() int32
	collectives   func() int64

	devAlloc      func(n uintptr) unsafe.Pointer
	devFree       func(p uintptr) int32
	streamCreate  func() uintptr
	streamDestroy func(s uintptr)
	memcpyAsync   func(dst, src, n, s uintptr) int32
	ticket        func(s uintptr) int64
	completed     func(s uintptr) int64
}

// Values of fake_last_init_kind.
const (
	kindByValue  = 1
	kindScalable = 2
	kindAll      = 3
)

func openFake(t testing.TB, path string) *fakeCtl {
	t.Helper()
	c := &fakeCtl{}
	fakelib.Bind(t, path,
		dl.Func{Ptr: &c.reset, Name: "fake_reset"},
		dl.Func{Ptr: &c.failNext, Name: "fake_fail_next"},
		dl.Func{Ptr: &c.setAsyncError, Name: "fake_set_async_error"},
		dl.Func{Ptr: &c.lastInitKind, Name: "fake_last_init_kind"},
		dl.Func{Ptr: &c.lastID, Name: "fake_last_id"},
		dl.Func{Ptr: &c.liveComms, Name: "fake_live_comms"},
		dl.Func{Ptr: &c.liveAllocs, Name: "fake_live_allocs"},
		dl.Func{Ptr: &c.collectives, Name: "fake_collectives"},
		dl.Func{Ptr: &c.devAlloc, Name: "fake_dev_alloc"},
		dl.Func{Ptr: &c.devFree, Name: "fake_dev_free"},
		dl.Func{Ptr: &c.streamCreate, Name: "fake_stream_create"},
		dl.Func{Ptr: &c.streamDestroy, Name: "fake_stream_destroy"},
		dl.Func{Ptr: &c.memcpyAsync, Name: "fake_memcpy_async"},
		dl.Func{Ptr: &c.ticket, Name: "fake_stream_ticket"},
		dl.Func{Ptr: &c.completed, Name: "fake_stream_completed"},
	)
	return c
}

// newFake loads the default fake, reset, and its library. The fake's state
// is global to the library, so these tests do not run in parallel.
func newFake(t testing.TB) (*Library, *fakeCtl) {
	t.Helper()
	return newFakeVariant(t, "default")
}

func newFakeVariant(t testing.TB, variant string, flags ...string) (*Library, *fakeCtl) {
	t.Helper()
	path := buildFake(t, variant, flags...)
	ctl := openFake(t, path)
	ctl.reset()
	l, err := Open(WithLibrary(path))
	require.NoError(t, err)
	require.Equal(t, path, l.Path())
	return l, ctl
}

// buf is fake device memory, readable from Go.
type buf struct {
	p     device.DevPtr
	bytes []byte
}

func (b buf) float32s() []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b.bytes))), len(b.bytes)/4)
}

func (b buf) uint16s() []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b.bytes))), len(b.bytes)/2)
}

// alloc returns n bytes of fake device memory, freed when the test ends.
func (c *fakeCtl) alloc(t testing.TB, n int) buf {
	t.Helper()
	p := c.devAlloc(uintptr(n))
	require.NotNil(t, p)
	t.Cleanup(func() { c.devFree(uintptr(p)) })
	return buf{p: device.DevPtr(uintptr(p)), bytes: unsafe.Slice((*byte)(p), n)}
}

// stream returns a fake stream, destroyed when the test ends.
func (c *fakeCtl) stream(t testing.TB) device.Stream {
	t.Helper()
	s := c.streamCreate()
	t.Cleanup(func() { c.streamDestroy(s) })
	return device.Stream(s)
}

// idle reports whether all work queued on s has run.
func (c *fakeCtl) idle(s device.Stream) bool { return c.completed(uintptr(s)) >= c.ticket(uintptr(s)) }

// fakeMem is a Memory over the fake's host "device" memory, in-order
// streams and events that complete with their stream's work.
type fakeMem struct {
	ctl *fakeCtl

	mu     sync.Mutex
	events map[device.Event]fakeEvent
	next   device.Event
	// failAlloc makes the n-th Alloc from now fail (1: the next).
	failAlloc int
	// queryErr is returned by Query when set.
	queryErr error
}

type fakeEvent struct {
	s      device.Stream
	ticket int64
}

var _ Memory = (*fakeMem)(nil)

func newFakeMem(ctl *fakeCtl) *fakeMem {
	return &fakeMem{ctl: ctl, events: map[device.Event]fakeEvent{}}
}

func (m *fakeMem) Alloc(size int64) (device.DevPtr, error) {
	m.mu.Lock()
	fail := m.failAlloc == 1
	if m.failAlloc > 0 {
		m.failAlloc--
	}
	m.mu.Unlock()
	if fail {
		return 0, fmt.Errorf("fake alloc %d: %w", size, device.ErrOutOfMemory)
	}
	p := m.ctl.devAlloc(uintptr(size))
	if p == nil {
		return 0, device.ErrOutOfMemory
	}
	return device.DevPtr(uintptr(p)), nil
}

func (m *fakeMem) Free(p device.DevPtr) error {
	if m.ctl.devFree(uintptr(p)) != 0 {
		return device.ErrInvalidValue
	}
	return nil
}

func (m *fakeMem) AllocHost(size int64) (device.HostBuf, error) {
	p := m.ctl.devAlloc(uintptr(size))
	if p == nil {
		return device.HostBuf{}, device.ErrOutOfMemory
	}
	return device.WrapHost(unsafe.Slice((*byte)(p), size)), nil
}

func (m *fakeMem) FreeHost(b device.HostBuf) error {
	if m.ctl.devFree(uintptr(b.Ptr())) != 0 {
		return device.ErrInvalidValue
	}
	return nil
}

func (m *fakeMem) NewStream() (device.Stream, error) { return device.Stream(m.ctl.streamCreate()), nil }

func (m *fakeMem) DestroyStream(s device.Stream) error {
	m.ctl.streamDestroy(uintptr(s))
	return nil
}

func (m *fakeMem) CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error {
	if m.ctl.memcpyAsync(uintptr(dst), uintptr(src.Ptr()), uintptr(src.Len()), uintptr(s)) != 0 {
		return device.ErrInvalidValue
	}
	return nil
}

func (m *fakeMem) CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error {
	if m.ctl.memcpyAsync(uintptr(dst.Ptr()), uintptr(src), uintptr(dst.Len()), uintptr(s)) != 0 {
		return device.ErrInvalidValue
	}
	return nil
}

func (m *fakeMem) NewEvent() (device.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	m.events[m.next] = fakeEvent{}
	return m.next, nil
}

func (m *fakeMem) Record(ev device.Event, s device.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.events[ev]; !ok {
		return device.ErrInvalidValue
	}
	m.events[ev] = fakeEvent{s: s, ticket: m.ctl.ticket(uintptr(s))}
	return nil
}

func (m *fakeMem) Query(ev device.Event) (bool, error) {
	m.mu.Lock()
	e, ok := m.events[ev]
	qerr := m.queryErr
	m.mu.Unlock()
	if qerr != nil {
		return false, qerr
	}
	if !ok {
		return false, device.ErrInvalidValue
	}
	return m.ctl.completed(uintptr(e.s)) >= e.ticket, nil
}

func (m *fakeMem) DestroyEvent(ev device.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.events[ev]; !ok {
		return device.ErrInvalidValue
	}
	delete(m.events, ev)
	return nil
}
