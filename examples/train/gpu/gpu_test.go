package gpu_test

import (
	"math"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/examples/train/gpu"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The Real tests need a GPU with the CUDA 13 libraries. They run only when
// CHAMELEON_CUDART points at libcudart, e.g.
//
//	CGO_ENABLED=0 go test -c -o gputest ./examples/train/gpu
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ./gputest -test.run Real -test.v
//
// The Fake tests run the same checks against testdata/fakegpu.c, which
// needs only a C compiler (fake_test.go).

// memory is where a test keeps its operands: GPU memory through libcudart,
// or Go memory for the fake libraries, which run kernels on the host.
type memory interface {
	alloc(t *testing.T, x []float32) device.DevPtr
	write(t *testing.T, p device.DevPtr, x []float32)
	read(t *testing.T, p device.DevPtr, n int) []float32
}

type rig struct {
	memory
	k *gpu.Kernels
}

type cudaMemory struct{ d *cuda.Device }

func (m cudaMemory) alloc(t *testing.T, x []float32) device.DevPtr {
	p, err := m.d.Alloc(int64(len(x)) * 4)
	require.NoError(t, err)
	t.Cleanup(func() { m.d.Free(p) })
	m.write(t, p, x)
	return p
}

func (m cudaMemory) write(t *testing.T, p device.DevPtr, x []float32) {
	require.NoError(t, m.d.WriteDevice(p, bytesOf(x)))
}

func (m cudaMemory) read(t *testing.T, p device.DevPtr, n int) []float32 {
	out := make([]float32, n)
	require.NoError(t, m.d.ReadDevice(bytesOf(out), p))
	return out
}

func newReal(t *testing.T) *rig {
	path := os.Getenv(cuda.EnvLibrary)
	if path == "" {
		t.Skipf("set %s to libcudart to run on a GPU", cuda.EnvLibrary)
	}
	d, err := cuda.New(cuda.WithLibrary(path))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	k, err := gpu.New(d.DefaultStream())
	require.NoError(t, err)
	t.Cleanup(func() { k.Close() })
	return &rig{memory: cudaMemory{d}, k: k}
}

func bytesOf(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*4)
}

func random(n int, seed uint64) []float32 {
	x := make([]float32, n)
	compute.UniformRef(x, seed, 1)
	return x
}

func near(t *testing.T, want, got []float32, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if d := math.Abs(float64(want[i] - got[i])); d > tol*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s: element %d: got %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestRealGemm(t *testing.T)        { checkGemm(t, newReal(t)) }
func TestRealElementwise(t *testing.T) { checkElementwise(t, newReal(t)) }
func TestRealClosed(t *testing.T)      { checkClosed(t, newReal(t)) }

// checkGemm checks the row-major mapping onto column-major cuBLAS for each
// transpose the model uses, with beta 0 and 1, and that a GEMM repeats
// its bits.
func checkGemm(t *testing.T, r *rig) {
	m, n, k := 67, 45, 129
	for _, c := range []struct{ tA, tB bool }{{false, false}, {true, false}, {false, true}} {
		a, b, c0 := random(m*k, 1), random(k*n, 2), random(m*n, 3)
		pa, pb, pc := r.alloc(t, a), r.alloc(t, b), r.alloc(t, c0)
		for _, beta := range []float32{0, 1} {
			want := append([]float32(nil), c0...)
			require.NoError(t, compute.GemmRef(c.tA, c.tB, m, n, k, 0.5, a, b, beta, want, 0, m))
			r.write(t, pc, c0)
			require.NoError(t, r.k.Gemm(c.tA, c.tB, m, n, k, 0.5, pa, pb, beta, pc))
			got := r.read(t, pc, m*n)
			near(t, want, got, 1e-4, "gemm")
			r.write(t, pc, c0)
			require.NoError(t, r.k.Gemm(c.tA, c.tB, m, n, k, 0.5, pa, pb, beta, pc))
			assert.Equal(t, got, r.read(t, pc, m*n), "tA=%v tB=%v beta=%v: not deterministic", c.tA, c.tB, beta)
		}
	}
	assert.ErrorIs(t, r.k.Gemm(false, false, 0, 1, 1, 1, 1, 1, 0, 1), device.ErrInvalidValue)
}

// checkElementwise checks every NVRTC kernel against the reference.
func checkElementwise(t *testing.T, r *rig) {
	const rows, cols = 300, 70
	n := rows * cols

	x := r.alloc(t, make([]float32, n))
	require.NoError(t, r.k.Uniform(x, n, 99, 0.75))
	want := make([]float32, n)
	compute.UniformRef(want, 99, 0.75)
	assert.Equal(t, want, r.read(t, x, n), "uniform: the same bits as the Go generator")

	a, b, bias := random(n, 4), random(n, 5), random(cols, 6)
	pa, pb, pbias, py := r.alloc(t, a), r.alloc(t, b), r.alloc(t, bias), r.alloc(t, make([]float32, n))
	for _, act := range []compute.Act{compute.Identity, compute.ReLU, compute.Tanh} {
		require.NoError(t, r.k.BiasAct(py, pa, pbias, rows, cols, act))
		compute.BiasActRef(want, a, bias, rows, cols, act)
		near(t, want, r.read(t, py, n), 1e-6, "bias act")
	}
	require.NoError(t, r.k.BiasAct(py, pa, 0, rows, cols, compute.ReLU))
	compute.BiasActRef(want, a, nil, rows, cols, compute.ReLU)
	near(t, want, r.read(t, py, n), 0, "bias act without bias")

	require.NoError(t, r.k.Add(py, pa, pb, n))
	compute.AddRef(want, a, b)
	near(t, want, r.read(t, py, n), 0, "add")

	require.NoError(t, r.k.ReluBackward(py, pa, pb, n))
	compute.ReluBackwardRef(want, a, b)
	near(t, want, r.read(t, py, n), 0, "relu backward")

	require.NoError(t, r.k.ColSum(py, pa, rows, cols, false))
	wantSum := make([]float32, cols)
	compute.ColSumRef(wantSum, a, rows, cols, false)
	near(t, wantSum, r.read(t, py, cols), 1e-4, "colsum")
	// Added to what y holds: the sums of a chunk of the rows on top.
	require.NoError(t, r.k.ColSum(py, pb, rows/2, cols, true))
	compute.ColSumRef(wantSum, b, rows/2, cols, true)
	near(t, wantSum, r.read(t, py, cols), 1e-4, "colsum added")

	require.NoError(t, r.k.MSELoss(py, pa, pb, n, n, false))
	near(t, []float32{compute.MSELossRef(a, b, n)}, r.read(t, py, 1), 1e-5, "mse loss")
	// In two chunks of the elements, each over the whole count, summed.
	h := n / 2
	require.NoError(t, r.k.MSELoss(py, pa, pb, h, n, false))
	pa2, pb2 := pa+device.DevPtr(4*h), pb+device.DevPtr(4*h)
	require.NoError(t, r.k.MSELoss(py, pa2, pb2, n-h, n, true))
	near(t, []float32{compute.MSELossRef(a[:h], b[:h], n) + compute.MSELossRef(a[h:], b[h:], n)}, r.read(t, py, 1), 1e-5, "mse loss in chunks")

	require.NoError(t, r.k.MSEBackward(py, pa, pb, n, n))
	compute.MSEBackwardRef(want, a, b, n)
	near(t, want, r.read(t, py, n), 1e-6, "mse backward")
	require.NoError(t, r.k.MSEBackward(py, pa, pb, h, 3*n))
	compute.MSEBackwardRef(want, a[:h], b[:h], 3*n)
	near(t, want[:h], r.read(t, py, h), 1e-6, "mse backward of a chunk")

	p, g, m := random(n, 7), random(n, 8), random(n, 9)
	pp, pg, pm := r.alloc(t, p), r.alloc(t, g), r.alloc(t, m)
	require.NoError(t, r.k.SGD(pp, pg, pm, n, 0.1, 0.9))
	compute.SGDRef(p, g, m, 0.1, 0.9)
	near(t, p, r.read(t, pp, n), 1e-6, "sgd p")
	near(t, m, r.read(t, pm, n), 1e-6, "sgd m")
}

func checkClosed(t *testing.T, r *rig) {
	require.NoError(t, r.k.Close())
	require.NoError(t, r.k.Close())
	assert.ErrorIs(t, r.k.Add(1, 1, 1, 1), device.ErrClosed)
	assert.ErrorIs(t, r.k.Gemm(false, false, 1, 1, 1, 1, 1, 1, 0, 1), device.ErrClosed)
}
