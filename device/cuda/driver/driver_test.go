package driver_test

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/device/internal/fakelib"
	"github.com/chameleon-go/chameleon/internal/dl"
)

var fakes *fakelib.Builder

func TestMain(m *testing.M) {
	b, err := fakelib.New("fakedriver")
	if err != nil {
		panic(err)
	}
	fakes = b
	code := 0
	func() {
		defer b.Close()
		goleak.VerifyTestMain(exitCode{m, &code})
	}()
	os.Exit(code)
}

// exitCode lets TestMain close the builder after goleak ran the tests.
type exitCode struct {
	m    *testing.M
	code *int
}

func (e exitCode) Run() int { *e.code = e.m.Run(); return *e.code }

type hooks struct {
	launches   func() int64
	lastNS     func() int64
	lastStream func() uintptr
	netPushes  func() int64
	retained   func() int32
	options    func() string
}

// fake builds testdata/fakedriver.c (variant adds flags) and returns its
// path and hooks.
func fake(t testing.TB, variant string, flags ...string) (string, *hooks) {
	t.Helper()
	path := fakes.Build(t, variant, filepath.Join("testdata", "fakedriver.c"), "libcuda-"+variant+".so", flags...)
	lib, err := dl.Open([]string{path}, os.ErrNotExist)
	require.NoError(t, err)
	h := &hooks{}
	require.NoError(t, lib.Bind(
		dl.Func{Ptr: &h.launches, Name: "fake_launches"},
		dl.Func{Ptr: &h.lastNS, Name: "fake_last_ns"},
		dl.Func{Ptr: &h.lastStream, Name: "fake_last_stream"},
		dl.Func{Ptr: &h.netPushes, Name: "fake_net_pushes"},
		dl.Func{Ptr: &h.retained, Name: "fake_retained"},
		dl.Func{Ptr: &h.options, Name: "fake_nvrtc_options"},
	))
	return path, h
}

func TestCandidates(t *testing.T) {
	t.Setenv(driver.EnvLibcuda, "/opt/libcuda-env.so")
	t.Setenv(driver.EnvCudart, "/cuda/lib/libcudart.so.13")
	assert.Equal(t, []string{
		"/opt/libcuda-env.so", "libcuda.so.1", "libcuda.so",
		"/cuda/lib/libcuda.so.1", "/cuda/lib/libcuda.so",
		"/usr/local/cuda/lib64/libcuda.so.1", "/usr/local/cuda/lib64/libcuda.so",
	}, driver.Candidates(driver.EnvLibcuda, driver.LibcudaNames...))
	t.Setenv(driver.EnvLibcuda, "")
	t.Setenv(driver.EnvCudart, "")
	assert.Equal(t, []string{"libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12",
		"/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.12"},
		driver.Candidates(driver.EnvNVRTC, driver.NVRTCNames...))
}

func TestLoadErrors(t *testing.T) {
	_, err := driver.Load("/nonexistent/libcuda.so.1")
	assert.ErrorIs(t, err, driver.ErrLibrary)
	assert.ErrorContains(t, err, "/nonexistent/libcuda.so.1")

	var d *driver.Driver
	require.NotPanics(t, func() { d, err = driver.Load("libm.so.6") })
	assert.Nil(t, d)
	assert.ErrorIs(t, err, driver.ErrLibrary)
	assert.ErrorContains(t, err, "cuInit")

	path, _ := fake(t, "nolaunch", "-DOMIT_LAUNCH")
	_, err = driver.Load(path)
	assert.ErrorIs(t, err, driver.ErrLibrary)
	assert.ErrorContains(t, err, "cuLaunchKernel")

	_, err = driver.LoadNVRTC("libm.so.6")
	assert.ErrorIs(t, err, driver.ErrLibrary)
	assert.ErrorContains(t, err, "nvrtcCreateProgram")
}

func TestContext(t *testing.T) {
	path, h := fake(t, "default")
	d, err := driver.Load(path)
	require.NoError(t, err)
	_, err = d.VMM()
	assert.ErrorIs(t, err, driver.ErrLibrary, "the fake has no virtual memory management")
	assert.ErrorContains(t, err, "cuMemGetAllocationGranularity")

	_, err = d.Primary(5)
	require.Error(t, err)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.ErrorContains(t, err, "cuDeviceGet: CUDA_ERROR_INVALID_DEVICE (101)")

	before := h.retained()
	c, err := d.Primary(1)
	require.NoError(t, err)
	assert.Equal(t, 1, c.Ordinal)
	assert.Equal(t, before+1, h.retained())

	_, err = c.LoadModule([]byte("not a module\x00"))
	assert.ErrorContains(t, err, "cuModuleLoadData")
	_, err = c.LoadModule(nil)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	m, err := c.LoadModule([]byte(driver.SpinSource + "\x00"))
	require.NoError(t, err)
	_, err = m.Function("nope")
	assert.ErrorContains(t, err, "cuModuleGetFunction nope: CUDA_ERROR_NOT_FOUND (500)")
	fn, err := m.Function(driver.SpinKernel)
	require.NoError(t, err)

	ns := new(uint64)
	*ns = 99
	params := &[1]unsafe.Pointer{unsafe.Pointer(ns)}
	err = c.Launch(fn, driver.Dim{}, driver.Dim{1, 1, 1}, 0, 5, unsafe.Pointer(params))
	assert.ErrorContains(t, err, "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (1)", "an empty grid")
	require.NoError(t, c.Launch(fn, driver.Dim{1, 1, 1}, driver.Dim{1, 1, 1}, 0, 5, unsafe.Pointer(params)))
	assert.EqualValues(t, 99, h.lastNS())
	assert.EqualValues(t, 5, h.lastStream())
	require.NoError(t, m.Unload())
	assert.Zero(t, h.netPushes(), "every push is popped")
	require.NoError(t, c.Release())
	assert.Equal(t, before, h.retained())
}

func newSpinner(t testing.TB, h **hooks) *driver.Spinner {
	t.Helper()
	path, hk := fake(t, "default")
	if h != nil {
		*h = hk
	}
	d, err := driver.Load(path)
	require.NoError(t, err)
	nv, err := driver.LoadNVRTC(path)
	require.NoError(t, err)
	c, err := d.Primary(0)
	require.NoError(t, err)
	t.Cleanup(func() { c.Release() })
	s, err := driver.NewSpinner(c, nv, "")
	require.NoError(t, err)
	return s
}

func TestSpin(t *testing.T) {
	var h *hooks
	s := newSpinner(t, &h)
	assert.Contains(t, h.options(), "--gpu-architecture=compute_90")
	before := h.launches()
	require.NoError(t, s.Spin(77, 1500))
	assert.Equal(t, before+1, h.launches())
	assert.EqualValues(t, 1500, h.lastNS())
	assert.EqualValues(t, 77, h.lastStream())
	require.NoError(t, s.Spin(78, 0))
	require.NoError(t, s.Spin(78, -5))
	assert.Equal(t, before+1, h.launches(), "no kernel for no time")
	require.NoError(t, s.SpinAt(79, 2500, 0x1000))
	assert.EqualValues(t, 2500, h.lastNS())
	assert.EqualValues(t, 79, h.lastStream())
	require.NoError(t, s.SpinAt(79, -3, 0x1000))
	assert.Equal(t, before+3, h.launches(), "a stamped kernel of no time still runs")
	assert.Zero(t, h.lastNS())
	allocs := testing.AllocsPerRun(100, func() { _ = s.Spin(3, 1000); _ = s.SpinAt(3, 1000, 0x1000) })
	if !raceEnabled {
		assert.Zero(t, allocs)
	}
	assert.Zero(t, h.netPushes())
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Spin(77, 10), device.ErrClosed)
	assert.ErrorIs(t, s.SpinAt(77, 10, 0x1000), device.ErrClosed)
}

func TestSpinCompileError(t *testing.T) {
	path, _ := fake(t, "default")
	d, err := driver.Load(path)
	require.NoError(t, err)
	nv, err := driver.LoadNVRTC(path)
	require.NoError(t, err)
	c, err := d.Primary(0)
	require.NoError(t, err)
	defer c.Release()
	_, err = driver.NewSpinner(c, nv, "sm_bogus")
	require.Error(t, err)
	assert.ErrorContains(t, err, "NVRTC_ERROR_COMPILATION")
	assert.ErrorContains(t, err, "--gpu-architecture=sm_bogus", "the compile log is in the error")
}

// BenchmarkSpinFake is the host cost of one Spin on the fake driver: what
// a timed replay pays per op on top of the driver's own launch.
func BenchmarkSpinFake(b *testing.B) {
	s := newSpinner(b, nil)
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Spin(1, 1000); err != nil {
			b.Fatal(err)
		}
	}
}
