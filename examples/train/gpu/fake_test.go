package gpu_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/train/gpu"
)

var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

// buildFake compiles testdata/fakegpu.c once per test binary and skips
// the test when there is no C compiler.
func buildFake(t *testing.T) string {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the fake GPU libraries: %v", cc, err)
	}
	if _, err := os.Stat(filepath.Join("testdata", "fakegpu.c")); err != nil {
		t.Skipf("run from the package directory: %v", err)
	}
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fakegpu")
		if err != nil {
			fakeErr = err
			return
		}
		fakePath = filepath.Join(dir, "libfakegpu.so")
		out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", fakePath, filepath.Join("testdata", "fakegpu.c"), "-lm").CombinedOutput()
		if err != nil {
			fakeErr = err
			t.Logf("%s", out)
		}
	})
	require.NoError(t, fakeErr)
	return fakePath
}

// goMemory hands out Go memory as "device" memory: the fake kernels run on
// the host at launch. The Go heap does not move objects, and bufs keeps
// them alive.
type goMemory struct {
	mu   sync.Mutex
	bufs map[device.DevPtr][]float32
}

func (m *goMemory) alloc(t *testing.T, x []float32) device.DevPtr {
	b := append([]float32(nil), x...)
	p := device.DevPtr(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	m.mu.Lock()
	m.bufs[p] = b
	m.mu.Unlock()
	return p
}

func (m *goMemory) buf(t *testing.T, p device.DevPtr) []float32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.bufs[p]
	require.True(t, ok, "not an allocation")
	return b
}

func (m *goMemory) write(t *testing.T, p device.DevPtr, x []float32) { copy(m.buf(t, p), x) }

func (m *goMemory) read(t *testing.T, p device.DevPtr, n int) []float32 {
	return append([]float32(nil), m.buf(t, p)[:n]...)
}

type fakeHooks struct {
	nvrtcOptions func() string
	launches     func() int32
	stream       func() uintptr
	mathMode     func() int32
}

func useFake(t *testing.T) (string, *fakeHooks) {
	path := buildFake(t)
	for _, env := range []string{gpu.EnvNVRTC, gpu.EnvLibcuda, gpu.EnvCublas} {
		t.Setenv(env, path)
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	require.NoError(t, err)
	hooks := &fakeHooks{}
	purego.RegisterLibFunc(&hooks.nvrtcOptions, h, "fake_nvrtc_options")
	purego.RegisterLibFunc(&hooks.launches, h, "fake_launches")
	purego.RegisterLibFunc(&hooks.stream, h, "fake_cublas_stream")
	purego.RegisterLibFunc(&hooks.mathMode, h, "fake_cublas_math_mode")
	return path, hooks
}

func newFake(t *testing.T, opts ...gpu.Option) (*rig, *fakeHooks) {
	_, hooks := useFake(t)
	k, err := gpu.New(device.Stream(77), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { k.Close() })
	return &rig{memory: &goMemory{bufs: map[device.DevPtr][]float32{}}, k: k}, hooks
}

func TestFakeGemm(t *testing.T) {
	r, _ := newFake(t)
	checkGemm(t, r)
}

func TestFakeElementwise(t *testing.T) {
	r, hooks := newFake(t)
	before := hooks.launches()
	checkElementwise(t, r)
	assert.Equal(t, int32(15), hooks.launches()-before, "one launch per kernel call")
}

func TestFakeClosed(t *testing.T) {
	r, _ := newFake(t)
	checkClosed(t, r)
}

// TestFakeSetup checks what New hands the libraries: the architecture to
// NVRTC, the Engine's stream and the math mode to cuBLAS.
func TestFakeSetup(t *testing.T) {
	_, hooks := newFake(t)
	assert.Contains(t, hooks.nvrtcOptions(), "--gpu-architecture=compute_90")
	assert.Equal(t, uintptr(77), hooks.stream())
	assert.Equal(t, int32(0), hooks.mathMode(), "plain fp32 by default")

	_, hooks = newFake(t, gpu.WithTF32(true), gpu.WithArch("compute_80"))
	assert.Contains(t, hooks.nvrtcOptions(), "--gpu-architecture=compute_80")
	assert.Equal(t, int32(3), hooks.mathMode(), "CUBLAS_TF32_TENSOR_OP_MATH")
}

// TestFakeErrors checks that failures come back as errors: a compile error
// with NVRTC's log, and a library without the symbols instead of a panic.
func TestFakeErrors(t *testing.T) {
	useFake(t)
	_, err := gpu.New(0, gpu.WithArch("sm_bogus"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NVRTC_ERROR_COMPILATION")
	assert.Contains(t, err.Error(), "--gpu-architecture=sm_bogus", "the compile log is in the error")

	_, err = gpu.New(0, gpu.WithDevice(3))
	assert.ErrorContains(t, err, "cuDeviceGet")

	t.Setenv(gpu.EnvCublas, "libm.so.6") // loads, but exports no cuBLAS
	_, err = gpu.New(0)
	assert.ErrorIs(t, err, gpu.ErrLibrary)
	assert.ErrorContains(t, err, "cublasCreate_v2")
}
