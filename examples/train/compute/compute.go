// Package compute is the arithmetic of the training example: the kernel set
// a small MLP needs for forward, backward and SGD with momentum, as an
// interface that a backend queues on the Engine's compute stream, and the
// float32 reference implementations on Go slices that the host backend runs
// and that the GPU backend is checked against.
//
// Every kernel takes device addresses, never tensors: the Engine may move a
// tensor between ops, so the caller resolves Tensor.Ptr inside the op that
// lists the tensor and passes the address it has now. Every kernel is
// deterministic (a fixed summation order per output element), which is what
// makes a run with a memory limit reproduce the losses of a run without one
// bit for bit: swapping moves bytes, it must not change arithmetic.
package compute

import (
	"fmt"
	"math"

	"github.com/chameleon-go/chameleon/device"
)

// Act is the activation BiasAct applies.
type Act uint8

// Activations.
const (
	Identity Act = iota
	ReLU
	Tanh
)

// Kernels queues work on one stream, the Engine's compute stream, in call
// order. Matrices are row-major float32. Methods return an error for a bad
// argument or a failed launch; the work itself is asynchronous.
type Kernels interface {
	// Gemm computes C = alpha*op(A)*op(B) + beta*C where C is m x n, op(A)
	// is m x k, op(B) is k x n, and op transposes the stored matrix when tA
	// (tB) is set. beta 0 ignores C's old contents, NaNs included.
	Gemm(tA, tB bool, m, n, k int, alpha float32, a, b device.DevPtr, beta float32, c device.DevPtr) error
	// Uniform fills x[0:n] with scale*(2u-1), u uniform in [0,1) from a
	// counter-based hash of (seed, i): the same numbers on every backend,
	// so a data set or an initialization needs no host upload. Scale 0
	// writes +0.
	Uniform(x device.DevPtr, n int, seed uint64, scale float32) error
	// BiasAct computes y[i,j] = act(x[i,j] + bias[j]) over rows x cols;
	// bias 0 means no bias. y may be x.
	BiasAct(y, x, bias device.DevPtr, rows, cols int, act Act) error
	// Add computes y = a + b over n elements.
	Add(y, a, b device.DevPtr, n int) error
	// ReluBackward computes dx = dy where y > 0, else 0 (y is the ReLU's
	// output). dx may be dy.
	ReluBackward(dx, dy, y device.DevPtr, n int) error
	// ColSum computes y[j] = sum over i of x[i,j] (a bias gradient);
	// with add, it adds the sums to y (a gradient summed over chunks of
	// the batch).
	ColSum(y, x device.DevPtr, rows, cols int, add bool) error
	// MSELoss writes 0.5*sum((pred-target)^2)/total over n elements to the
	// scalar loss, 0.5*mean((pred-target)^2) when total is n; with add,
	// it adds it to loss (a loss computed a chunk of the batch at a time,
	// total the whole batch's elements).
	MSELoss(loss, pred, target device.DevPtr, n, total int, add bool) error
	// MSEBackward computes grad = (pred-target)/total over n elements.
	MSEBackward(grad, pred, target device.DevPtr, n, total int) error
	// SGD applies momentum SGD in place: m = mu*m + g; p -= lr*m.
	SGD(p, g, m device.DevPtr, n int, lr, mu float32) error
}

// Hash is the counter-based generator behind Uniform (splitmix64 of
// seed + (i+1)*golden), written so that CUDA C computes the same bits.
func Hash(seed, i uint64) uint64 {
	z := seed + (i+1)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// UniformAt is element i of Uniform(seed, scale). The 24 high bits make u
// exactly representable, and 2u-1 is exact too, so the only rounding is
// the final multiply: identical on every IEEE float32 machine.
func UniformAt(seed, i uint64, scale float32) float32 {
	if scale == 0 {
		return 0
	}
	u := float32(Hash(seed, i)>>40) * (1.0 / (1 << 24))
	return scale * (2*u - 1)
}

// Reference implementations on Go slices. They are what the host backend
// runs and what GPU results are compared against.

// GemmRef is Gemm on slices. Rows of C are independent: row0 and row1
// select a range, so that callers can split the work across goroutines
// without changing any element's summation order.
func GemmRef(tA, tB bool, m, n, k int, alpha float32, a, b []float32, beta float32, c []float32, row0, row1 int) error {
	if tA && tB {
		return fmt.Errorf("compute: gemm with both operands transposed is not implemented")
	}
	for i := row0; i < row1; i++ {
		crow := c[i*n : i*n+n]
		if beta == 0 {
			clear(crow)
		} else if beta != 1 {
			for j := range crow {
				crow[j] *= beta
			}
		}
		switch {
		case !tA && !tB: // A m x k, B k x n
			arow := a[i*k : i*k+k]
			for p, av := range arow {
				av *= alpha
				brow := b[p*n : p*n+n]
				brow = brow[:len(crow)]
				for j, bv := range brow {
					crow[j] += av * bv
				}
			}
		case tA: // A stored k x m
			for p := range k {
				av := alpha * a[p*m+i]
				brow := b[p*n : p*n+n]
				brow = brow[:len(crow)]
				for j, bv := range brow {
					crow[j] += av * bv
				}
			}
		default: // B stored n x k
			arow := a[i*k : i*k+k]
			for j := range crow {
				brow := b[j*k : j*k+k]
				brow = brow[:len(arow)]
				var s float32
				for p, av := range arow {
					s += av * brow[p]
				}
				crow[j] += alpha * s
			}
		}
	}
	return nil
}

// UniformRef is Uniform on a slice.
func UniformRef(x []float32, seed uint64, scale float32) {
	for i := range x {
		x[i] = UniformAt(seed, uint64(i), scale)
	}
}

// BiasActRef is BiasAct on slices; bias may be nil.
func BiasActRef(y, x, bias []float32, rows, cols int, act Act) {
	for i := range rows {
		xr, yr := x[i*cols:i*cols+cols], y[i*cols:i*cols+cols]
		for j, v := range xr {
			if bias != nil {
				v += bias[j]
			}
			switch act {
			case ReLU:
				v = max(v, 0)
			case Tanh:
				v = float32(math.Tanh(float64(v)))
			}
			yr[j] = v
		}
	}
}

// AddRef is Add on slices.
func AddRef(y, a, b []float32) {
	b = b[:len(a)]
	y = y[:len(a)]
	for i, v := range a {
		y[i] = v + b[i]
	}
}

// ReluBackwardRef is ReluBackward on slices.
func ReluBackwardRef(dx, dy, y []float32) {
	y = y[:len(dy)]
	dx = dx[:len(dy)]
	for i, g := range dy {
		if y[i] > 0 {
			dx[i] = g
		} else {
			dx[i] = 0
		}
	}
}

// ColSumRef is ColSum on slices: each column summed in row order, added
// to y with add.
func ColSumRef(y, x []float32, rows, cols int, add bool) {
	if !add {
		clear(y[:cols])
	}
	for i := range rows {
		xr := x[i*cols : i*cols+cols]
		for j, v := range xr {
			y[j] += v
		}
	}
}

// MSELossRef returns 0.5*sum((pred-target)^2)/total, summed in order:
// 0.5*mean((pred-target)^2) when total is len(pred).
func MSELossRef(pred, target []float32, total int) float32 {
	var s float32
	target = target[:len(pred)]
	for i, p := range pred {
		d := p - target[i]
		s += d * d
	}
	return 0.5 * s / float32(total)
}

// MSEBackwardRef is MSEBackward on slices.
func MSEBackwardRef(grad, pred, target []float32, total int) {
	inv := 1 / float32(total)
	target = target[:len(pred)]
	grad = grad[:len(pred)]
	for i, p := range pred {
		grad[i] = (p - target[i]) * inv
	}
}

// SGDRef is SGD on slices.
func SGDRef(p, g, m []float32, lr, mu float32) {
	g = g[:len(p)]
	m = m[:len(p)]
	for i := range p {
		m[i] = mu*m[i] + g[i]
		p[i] -= lr * m[i]
	}
}
