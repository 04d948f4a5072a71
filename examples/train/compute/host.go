package compute

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// Host runs the reference kernels on the pure-Go backend. Each kernel is
// queued with host.Device.Launch on the compute stream instead of running
// on the caller's goroutine: the Engine orders a swapped-in tensor's use by
// a StreamWait on that stream, so only work queued behind the wait is sure
// to see the tensor's bytes back.
type Host struct {
	d       *host.Device
	s       device.Stream
	workers int
}

var _ Kernels = (*Host)(nil)

// NewHost returns kernels queued on stream s of d. A GEMM is split by rows
// over up to workers goroutines (0: GOMAXPROCS); the split does not change
// any element's summation order, so results do not depend on it.
func NewHost(d *host.Device, s device.Stream, workers int) *Host {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &Host{d: d, s: s, workers: workers}
}

// f32 resolves n float32s of device memory at p. Resolving when the kernel
// is queued, not when it runs, takes the address the tensor has during the
// op; the memory stays valid because the Engine's allocator keeps its
// reservation for the Engine's life.
func (h *Host) f32(what string, p device.DevPtr, n int) ([]float32, error) {
	if n <= 0 {
		return nil, fmt.Errorf("compute: %s: %d elements", what, n)
	}
	b := h.d.Bytes(p, int64(n)*4)
	if b == nil {
		return nil, fmt.Errorf("compute: %s: %d floats at %#x are not device memory: %w", what, n, uintptr(p), device.ErrInvalidValue)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n), nil
}

// Gemm implements Kernels.
func (h *Host) Gemm(tA, tB bool, m, n, k int, alpha float32, a, b device.DevPtr, beta float32, c device.DevPtr) error {
	if tA && tB {
		return fmt.Errorf("compute: gemm with both operands transposed is not implemented")
	}
	as, err := h.f32("gemm A", a, m*k)
	if err != nil {
		return err
	}
	bs, err := h.f32("gemm B", b, k*n)
	if err != nil {
		return err
	}
	cs, err := h.f32("gemm C", c, m*n)
	if err != nil {
		return err
	}
	parts := min(h.workers, max(1, m*n*k>>16), m)
	return h.d.Launch(h.s, func() {
		if parts == 1 {
			GemmRef(tA, tB, m, n, k, alpha, as, bs, beta, cs, 0, m)
			return
		}
		var wg sync.WaitGroup
		for w := range parts {
			wg.Go(func() {
				GemmRef(tA, tB, m, n, k, alpha, as, bs, beta, cs, w*m/parts, (w+1)*m/parts)
			})
		}
		wg.Wait()
	})
}

// Uniform implements Kernels.
func (h *Host) Uniform(x device.DevPtr, n int, seed uint64, scale float32) error {
	xs, err := h.f32("uniform", x, n)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() { UniformRef(xs, seed, scale) })
}

// BiasAct implements Kernels.
func (h *Host) BiasAct(y, x, bias device.DevPtr, rows, cols int, act Act) error {
	xs, err := h.f32("bias act x", x, rows*cols)
	if err != nil {
		return err
	}
	ys, err := h.f32("bias act y", y, rows*cols)
	if err != nil {
		return err
	}
	var bs []float32
	if bias != 0 {
		if bs, err = h.f32("bias act bias", bias, cols); err != nil {
			return err
		}
	}
	return h.d.Launch(h.s, func() { BiasActRef(ys, xs, bs, rows, cols, act) })
}

// Add implements Kernels.
func (h *Host) Add(y, a, b device.DevPtr, n int) error {
	ys, err := h.f32("add y", y, n)
	if err != nil {
		return err
	}
	as, err := h.f32("add a", a, n)
	if err != nil {
		return err
	}
	bs, err := h.f32("add b", b, n)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() { AddRef(ys, as, bs) })
}

// ReluBackward implements Kernels.
func (h *Host) ReluBackward(dx, dy, y device.DevPtr, n int) error {
	dxs, err := h.f32("relu backward dx", dx, n)
	if err != nil {
		return err
	}
	dys, err := h.f32("relu backward dy", dy, n)
	if err != nil {
		return err
	}
	ys, err := h.f32("relu backward y", y, n)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() { ReluBackwardRef(dxs, dys, ys) })
}

// ColSum implements Kernels.
func (h *Host) ColSum(y, x device.DevPtr, rows, cols int, add bool) error {
	ys, err := h.f32("colsum y", y, cols)
	if err != nil {
		return err
	}
	xs, err := h.f32("colsum x", x, rows*cols)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() { ColSumRef(ys, xs, rows, cols, add) })
}

// MSELoss implements Kernels.
func (h *Host) MSELoss(loss, pred, target device.DevPtr, n, total int, add bool) error {
	ls, err := h.f32("mse loss", loss, 1)
	if err != nil {
		return err
	}
	ps, err := h.f32("mse pred", pred, n)
	if err != nil {
		return err
	}
	ts, err := h.f32("mse target", target, n)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() {
		v := MSELossRef(ps, ts, total)
		if add {
			v += ls[0]
		}
		ls[0] = v
	})
}

// MSEBackward implements Kernels.
func (h *Host) MSEBackward(grad, pred, target device.DevPtr, n, total int) error {
	gs, err := h.f32("mse backward grad", grad, n)
	if err != nil {
		return err
	}
	ps, err := h.f32("mse backward pred", pred, n)
	if err != nil {
		return err
	}
	ts, err := h.f32("mse backward target", target, n)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() { MSEBackwardRef(gs, ps, ts, total) })
}

// SGD implements Kernels.
func (h *Host) SGD(p, g, m device.DevPtr, n int, lr, mu float32) error {
	ps, err := h.f32("sgd p", p, n)
	if err != nil {
		return err
	}
	gs, err := h.f32("sgd g", g, n)
	if err != nil {
		return err
	}
	ms, err := h.f32("sgd m", m, n)
	if err != nil {
		return err
	}
	return h.d.Launch(h.s, func() { SGDRef(ps, gs, ms, lr, mu) })
}
