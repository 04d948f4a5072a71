package gpu

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/examples/train/compute"
)

// source holds the elementwise kernels. Each output element is computed by
// one thread in a fixed order, and the two reductions (ColSum, MSELoss)
// combine partial sums in a fixed tree, so every kernel is deterministic:
// a run repeats its bits, whatever the Engine swapped.
const source = `
typedef unsigned long long u64;

__device__ __forceinline__ u64 mixhash(u64 seed, u64 i) {
	u64 z = seed + (i + 1ULL) * 0x9E3779B97F4A7C15ULL;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

#define LOOP(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

extern "C" __global__ void uniform_fill(float *x, long long n, u64 seed, float scale) {
	LOOP(i, n) {
		if (scale == 0.0f) { x[i] = 0.0f; continue; }
		float u = (float)(mixhash(seed, (u64)i) >> 40) * (1.0f / 16777216.0f);
		x[i] = scale * (2.0f * u - 1.0f);
	}
}

extern "C" __global__ void bias_act(float *y, const float *x, const float *bias, long long rows, int cols, int act) {
	LOOP(i, rows * cols) {
		float v = x[i];
		if (bias) v += bias[i % cols];
		if (act == 1) v = fmaxf(v, 0.0f);
		else if (act == 2) v = tanhf(v);
		y[i] = v;
	}
}

extern "C" __global__ void add(float *y, const float *a, const float *b, long long n) {
	LOOP(i, n) y[i] = a[i] + b[i];
}

extern "C" __global__ void relu_backward(float *dx, const float *dy, const float *y, long long n) {
	LOOP(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// One block of 32x32 threads per 32 columns: thread (c, r) sums rows
// r, r+32, ... of column c, then row 0 adds the 32 partial sums in order.
extern "C" __global__ void colsum(float *y, const float *x, long long rows, int cols, int add) {
	__shared__ float part[32][33];
	int c = blockIdx.x * 32 + threadIdx.x;
	float s = 0.0f;
	if (c < cols)
		for (long long r = threadIdx.y; r < rows; r += 32) s += x[r * cols + c];
	part[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && c < cols) {
		float t = 0.0f;
		for (int k = 0; k < 32; k++) t += part[k][threadIdx.x];
		y[c] = add ? y[c] + t : t;
	}
}

// One block of 1024 threads: strided partial sums, then a tree.
extern "C" __global__ void mse_loss(float *loss, const float *pred, const float *target, long long n, long long total, int add) {
	__shared__ float part[1024];
	float s = 0.0f;
	for (long long i = threadIdx.x; i < n; i += blockDim.x) {
		float d = pred[i] - target[i];
		s += d * d;
	}
	part[threadIdx.x] = s;
	__syncthreads();
	for (int w = blockDim.x / 2; w > 0; w /= 2) {
		if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		float v = 0.5f * part[0] / (float)total;
		loss[0] = add ? v + loss[0] : v;
	}
}

extern "C" __global__ void mse_backward(float *grad, const float *pred, const float *target, long long n, long long total) {
	float inv = 1.0f / (float)total;
	LOOP(i, n) grad[i] = (pred[i] - target[i]) * inv;
}

extern "C" __global__ void sgd_momentum(float *p, const float *g, float *m, long long n, float lr, float mu) {
	LOOP(i, n) {
		float v = mu * m[i] + g[i];
		m[i] = v;
		p[i] -= lr * v;
	}
}
`

var kernelNames = []string{"uniform_fill", "bias_act", "add", "relu_backward", "colsum", "mse_loss", "mse_backward", "sgd_momentum"}

const (
	kUniform = iota
	kBiasAct
	kAdd
	kReluBackward
	kColSum
	kMSELoss
	kMSEBackward
	kSGD
	numKernels
)

// Option configures New.
type Option func(*config)

type config struct {
	arch    string
	ordinal int
	tf32    bool
}

// WithArch sets NVRTC's --gpu-architecture (default compute_90, the H100
// and H200; the driver compiles the PTX for the GPU it runs on).
func WithArch(arch string) Option {
	return func(c *config) {
		if arch != "" {
			c.arch = arch
		}
	}
}

// WithDevice selects the GPU by ordinal (default 0); it must be the one
// device/cuda uses.
func WithDevice(ordinal int) Option { return func(c *config) { c.ordinal = ordinal } }

// WithTF32 lets cuBLAS run the fp32 GEMMs on TF32 tensor cores: about 8x
// the throughput on an H200 at a 10-bit mantissa for the products. Runs
// stay deterministic.
func WithTF32(on bool) Option { return func(c *config) { c.tf32 = on } }

// Kernels implements compute.Kernels on one CUDA stream.
type Kernels struct {
	nv     *driver.NVRTC
	ctx    *driver.Context
	bl     *cublas
	mod    *driver.Module
	fns    [numKernels]driver.Function
	handle uintptr
	stream device.Stream

	mu     sync.Mutex
	closed bool
	// sc holds the kernel parameters and GEMM scalars passed to C. It is
	// pinned: cuLaunchKernel takes an array of pointers to the parameter
	// values, so C reads Go pointers out of Go memory.
	sc  *scratch
	pin runtime.Pinner
}

type scratch struct {
	vals        [8]uint64
	ptrs        [8]unsafe.Pointer
	alpha, beta float32
}

var _ compute.Kernels = (*Kernels)(nil)

// New loads the libraries, compiles the kernels and binds cuBLAS to
// stream, the Engine's compute stream (a cudaStream_t; 0 is the legacy
// default stream, device/cuda's default). The CUDA runtime must already
// be initialized on the device (device/cuda.New does that).
func New(stream device.Stream, opts ...Option) (*Kernels, error) {
	cfg := config{arch: "compute_90"}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	k := &Kernels{stream: stream, sc: new(scratch)}
	k.pin.Pin(k.sc)
	for i := range k.sc.ptrs {
		k.sc.ptrs[i] = unsafe.Pointer(&k.sc.vals[i])
	}
	done := false
	defer func() {
		if !done {
			k.Close()
		}
	}()
	var err error
	if k.nv, err = driver.LoadNVRTC(); err != nil {
		return nil, err
	}
	drv, err := driver.Load()
	if err != nil {
		return nil, err
	}
	if k.bl, err = loadCublas(); err != nil {
		return nil, err
	}
	if k.ctx, err = drv.Primary(cfg.ordinal); err != nil {
		return nil, err
	}
	ptx, err := k.nv.Compile(source, "train_kernels.cu", "--gpu-architecture="+cfg.arch)
	if err != nil {
		return nil, err
	}
	if k.mod, err = k.ctx.LoadModule(ptx); err != nil {
		return nil, err
	}
	for i, name := range kernelNames {
		if k.fns[i], err = k.mod.Function(name); err != nil {
			return nil, err
		}
	}
	if err := k.bl.check("cublasCreate_v2", k.bl.create(&k.handle)); err != nil {
		return nil, err
	}
	if err := k.bl.check("cublasSetStream_v2", k.bl.setStream(k.handle, uintptr(stream))); err != nil {
		return nil, err
	}
	if err := k.bl.check("cublasSetPointerMode_v2", k.bl.setPointerMode(k.handle, pointerModeHst)); err != nil {
		return nil, err
	}
	mode := int32(mathDefault)
	if cfg.tf32 {
		mode = mathTF32
	}
	if err := k.bl.check("cublasSetMathMode", k.bl.setMathMode(k.handle, mode)); err != nil {
		return nil, err
	}
	done = true
	return k, nil
}

// Close releases the cuBLAS handle, the module and the context reference.
// Work already queued still runs.
func (k *Kernels) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	var errs []error
	if k.handle != 0 {
		errs = append(errs, k.bl.check("cublasDestroy_v2", k.bl.destroy(k.handle)))
	}
	if k.mod != nil {
		errs = append(errs, k.mod.Unload())
	}
	if k.ctx != nil {
		errs = append(errs, k.ctx.Release())
	}
	k.pin.Unpin()
	return errors.Join(errs...)
}

// arg encodings of kernel parameters: each value sits in an 8-byte slot,
// and the kernel reads as many bytes as its parameter's type has.
func ptrArg(p device.DevPtr) uint64 { return uint64(p) }
func i64Arg(n int) uint64           { return uint64(int64(n)) }
func i32Arg(n int) uint64           { return uint64(uint32(int32(n))) }
func f32Arg(f float32) uint64       { return uint64(math.Float32bits(f)) }

// boolInt is a flag as a kernel's int argument.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func grid(n int) uint32 { return uint32(min((n+255)/256, 1<<20)) }

// launch queues kernel i on the stream with a grid of gx blocks of bx*by
// threads.
func (k *Kernels) launch(i int, gx, bx, by uint32, args ...uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("gpu: %s: %w", kernelNames[i], device.ErrClosed)
	}
	copy(k.sc.vals[:], args)
	if err := k.ctx.Launch(k.fns[i], driver.Dim{X: gx, Y: 1, Z: 1}, driver.Dim{X: bx, Y: by, Z: 1}, 0,
		k.stream, unsafe.Pointer(&k.sc.ptrs[0])); err != nil {
		return fmt.Errorf("gpu: %s: %w", kernelNames[i], err)
	}
	return nil
}

func checkSize(what string, ns ...int) error {
	for _, n := range ns {
		if n <= 0 || n > math.MaxInt32 {
			return fmt.Errorf("gpu: %s: size %d outside [1, 2^31): %w", what, n, device.ErrInvalidValue)
		}
	}
	return nil
}

// Gemm implements compute.Kernels with cublasSgemm_v2. cuBLAS is
// column-major and a row-major matrix is its transpose, so the row-major
// C = op(A)*op(B) is computed as the column-major C^T = op(B)^T*op(A)^T:
// the operands swap places and keep their transpose flags.
func (k *Kernels) Gemm(tA, tB bool, m, n, kk int, alpha float32, a, b device.DevPtr, beta float32, c device.DevPtr) error {
	if err := checkSize("gemm", m, n, kk); err != nil {
		return err
	}
	opA, lda := uintptr(opN), kk
	if tA {
		opA, lda = opT, m
	}
	opB, ldb := uintptr(opN), n
	if tB {
		opB, ldb = opT, kk
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("gpu: gemm: %w", device.ErrClosed)
	}
	// Host scalars: cuBLAS reads them before the call returns.
	k.sc.alpha, k.sc.beta = alpha, beta
	// The context current on this goroutine's OS thread, as for a launch:
	// goroutines move between threads, and one the CUDA runtime has not
	// touched yet may have none.
	if err := k.ctx.Enter(); err != nil {
		return fmt.Errorf("gpu: gemm: %w", err)
	}
	rc, _, _ := purego.SyscallN(k.bl.sgemm, k.handle, opB, opA, uintptr(n), uintptr(m), uintptr(kk),
		uintptr(unsafe.Pointer(&k.sc.alpha)), uintptr(b), uintptr(ldb), uintptr(a), uintptr(lda),
		uintptr(unsafe.Pointer(&k.sc.beta)), uintptr(c), uintptr(n))
	k.ctx.Leave()
	return k.bl.check(fmt.Sprintf("cublasSgemm_v2 %dx%dx%d", m, n, kk), int32(rc))
}

// Uniform implements compute.Kernels.
func (k *Kernels) Uniform(x device.DevPtr, n int, seed uint64, scale float32) error {
	if err := checkSize("uniform", n); err != nil {
		return err
	}
	return k.launch(kUniform, grid(n), 256, 1, ptrArg(x), i64Arg(n), seed, f32Arg(scale))
}

// BiasAct implements compute.Kernels.
func (k *Kernels) BiasAct(y, x, bias device.DevPtr, rows, cols int, act compute.Act) error {
	if err := checkSize("bias act", rows, cols); err != nil {
		return err
	}
	return k.launch(kBiasAct, grid(rows*cols), 256, 1, ptrArg(y), ptrArg(x), ptrArg(bias), i64Arg(rows), i32Arg(cols), i32Arg(int(act)))
}

// Add implements compute.Kernels.
func (k *Kernels) Add(y, a, b device.DevPtr, n int) error {
	if err := checkSize("add", n); err != nil {
		return err
	}
	return k.launch(kAdd, grid(n), 256, 1, ptrArg(y), ptrArg(a), ptrArg(b), i64Arg(n))
}

// ReluBackward implements compute.Kernels.
func (k *Kernels) ReluBackward(dx, dy, y device.DevPtr, n int) error {
	if err := checkSize("relu backward", n); err != nil {
		return err
	}
	return k.launch(kReluBackward, grid(n), 256, 1, ptrArg(dx), ptrArg(dy), ptrArg(y), i64Arg(n))
}

// ColSum implements compute.Kernels.
func (k *Kernels) ColSum(y, x device.DevPtr, rows, cols int, add bool) error {
	if err := checkSize("colsum", rows, cols); err != nil {
		return err
	}
	return k.launch(kColSum, uint32((cols+31)/32), 32, 32, ptrArg(y), ptrArg(x), i64Arg(rows), i32Arg(cols), i32Arg(boolInt(add)))
}

// MSELoss implements compute.Kernels.
func (k *Kernels) MSELoss(loss, pred, target device.DevPtr, n, total int, add bool) error {
	if err := checkSize("mse loss", n, total); err != nil {
		return err
	}
	return k.launch(kMSELoss, 1, 1024, 1, ptrArg(loss), ptrArg(pred), ptrArg(target), i64Arg(n), i64Arg(total), i32Arg(boolInt(add)))
}

// MSEBackward implements compute.Kernels.
func (k *Kernels) MSEBackward(grad, pred, target device.DevPtr, n, total int) error {
	if err := checkSize("mse backward", n, total); err != nil {
		return err
	}
	return k.launch(kMSEBackward, grid(n), 256, 1, ptrArg(grad), ptrArg(pred), ptrArg(target), i64Arg(n), i64Arg(total))
}

// SGD implements compute.Kernels.
func (k *Kernels) SGD(p, g, m device.DevPtr, n int, lr, mu float32) error {
	if err := checkSize("sgd", n); err != nil {
		return err
	}
	return k.launch(kSGD, grid(n), 256, 1, ptrArg(p), ptrArg(g), ptrArg(m), i64Arg(n), f32Arg(lr), f32Arg(mu))
}
