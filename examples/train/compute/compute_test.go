package compute_test

import (
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/examples/train/compute"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// naive is op(A)*op(B) in float64, row-major.
func naive(tA, tB bool, m, n, k int, a, b []float32) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			for p := range k {
				av := a[i*k+p]
				if tA {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tB {
					bv = b[j*k+p]
				}
				c[i*n+j] += float64(av) * float64(bv)
			}
		}
	}
	return c
}

func TestGemmRef(t *testing.T) {
	m, n, k := 7, 5, 11
	a, b := make([]float32, m*k), make([]float32, k*n)
	compute.UniformRef(a, 1, 1)
	compute.UniformRef(b, 2, 1)
	for _, c := range []struct{ tA, tB bool }{{false, false}, {true, false}, {false, true}} {
		want := naive(c.tA, c.tB, m, n, k, a, b)
		got := make([]float32, m*n)
		for i := range got {
			got[i] = float32(math.NaN()) // beta 0 must ignore old contents
		}
		require.NoError(t, compute.GemmRef(c.tA, c.tB, m, n, k, 2, a, b, 0, got, 0, m))
		for i := range got {
			assert.InDelta(t, 2*want[i], got[i], 1e-5, "tA=%v tB=%v element %d", c.tA, c.tB, i)
		}
		require.NoError(t, compute.GemmRef(c.tA, c.tB, m, n, k, 1, a, b, 1, got, 0, m))
		for i := range got {
			assert.InDelta(t, 3*want[i], got[i], 1e-5, "beta 1: tA=%v tB=%v element %d", c.tA, c.tB, i)
		}
	}
	assert.Error(t, compute.GemmRef(true, true, m, n, k, 1, a, b, 0, make([]float32, m*n), 0, m))
}

func TestUniform(t *testing.T) {
	x := make([]float32, 100000)
	compute.UniformRef(x, 5, 2)
	var s, s2 float64
	for _, v := range x {
		require.True(t, v >= -2 && v < 2)
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	mean, variance := s/float64(len(x)), s2/float64(len(x))
	assert.InDelta(t, 0, mean, 0.02)
	assert.InDelta(t, 4.0/3, variance, 0.02, "uniform on [-2, 2)")
	assert.Equal(t, uint32(0), math.Float32bits(compute.UniformAt(5, 3, 0)), "scale 0 is +0")
}

// TestHostParallelGemmBits checks that splitting a GEMM over goroutines
// does not change a bit: each row keeps its summation order.
func TestHostParallelGemmBits(t *testing.T) {
	d, err := host.New(1 << 20)
	require.NoError(t, err)
	defer d.Close()
	m, n, k := 64, 48, 80
	pa, err := d.Alloc(int64(m * k * 4))
	require.NoError(t, err)
	pb, err := d.Alloc(int64(k * n * 4))
	require.NoError(t, err)
	var outs [][]float32
	for _, workers := range []int{1, 3, 8} {
		pc, err := d.Alloc(int64(m * n * 4))
		require.NoError(t, err)
		h := compute.NewHost(d, 0, workers)
		require.NoError(t, h.Uniform(pa, m*k, 1, 1))
		require.NoError(t, h.Uniform(pb, k*n, 2, 1))
		require.NoError(t, h.Gemm(false, false, m, n, k, 1, pa, pb, 0, pc))
		require.NoError(t, d.SyncStream(0))
		c := make([]float32, m*n)
		copy(c, unsafeFloats(d.Bytes(pc, int64(m*n*4))))
		outs = append(outs, c)
	}
	assert.Equal(t, outs[0], outs[1])
	assert.Equal(t, outs[0], outs[2])

	h := compute.NewHost(d, 0, 1)
	assert.Error(t, h.Add(pa, pa, pa+1<<30, 4), "an address outside device memory")
}

func unsafeFloats(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
