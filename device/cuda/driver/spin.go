package driver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/chameleon-go/chameleon/device"
)

// SpinSource is the spin kernel: one thread that reads the GPU's global
// timer (nanoseconds) until ns have passed since it started. It occupies
// one warp slot of one SM, so it orders the stream it runs on for its time
// without competing with copies for the link.
//
// chameleon_spin_at does the same and writes when it started and ended
// (the global timer's nanoseconds) into at[0] and at[1]: a timeline of the
// stream's work on the device's own clock.
const SpinSource = `
extern "C" __global__ void chameleon_spin(unsigned long long ns) {
	unsigned long long start, now;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
	} while (now - start < ns);
}
extern "C" __global__ void chameleon_spin_at(unsigned long long ns, unsigned long long *at) {
	unsigned long long start, now;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
	} while (now - start < ns);
	at[0] = start;
	at[1] = now;
}
`

// SpinKernel and SpinAtKernel are the kernels' names in SpinSource.
const (
	SpinKernel   = "chameleon_spin"
	SpinAtKernel = "chameleon_spin_at"
)

// DefaultArch is the architecture NVRTC compiles for unless told
// otherwise: compute_90 (H100, H200); the driver compiles the PTX for the
// GPU it runs on, so later GPUs run it too.
const DefaultArch = "compute_90"

// Spinner launches the spin kernel, compiled once.
type Spinner struct {
	c    *Context
	mod  *Module
	fn   Function
	fnAt Function

	mu     sync.Mutex
	closed bool
	// sc holds the kernel parameter: cuLaunchKernel reads the pointer
	// array and the value it points at, so both are pinned Go memory.
	sc  *spinScratch
	pin runtime.Pinner
}

type spinScratch struct {
	ns    uint64
	at    uint64 // chameleon_spin_at's device pointer
	ptr   [1]unsafe.Pointer
	ptrAt [2]unsafe.Pointer
}

// NewSpinner compiles SpinSource with nv for arch (DefaultArch when
// empty) and loads it in c.
func NewSpinner(c *Context, nv *NVRTC, arch string) (*Spinner, error) {
	if arch == "" {
		arch = DefaultArch
	}
	ptx, err := nv.Compile(SpinSource, "chameleon_spin.cu", "--gpu-architecture="+arch)
	if err != nil {
		return nil, fmt.Errorf("spin: %w", err)
	}
	mod, err := c.LoadModule(ptx)
	if err != nil {
		return nil, fmt.Errorf("spin: %w", err)
	}
	fn, err := mod.Function(SpinKernel)
	if err != nil {
		return nil, fmt.Errorf("spin: %w", errors.Join(err, mod.Unload()))
	}
	fnAt, err := mod.Function(SpinAtKernel)
	if err != nil {
		return nil, fmt.Errorf("spin: %w", errors.Join(err, mod.Unload()))
	}
	s := &Spinner{c: c, mod: mod, fn: fn, fnAt: fnAt, sc: new(spinScratch)}
	s.pin.Pin(s.sc)
	s.sc.ptr[0] = unsafe.Pointer(&s.sc.ns)
	s.sc.ptrAt[0], s.sc.ptrAt[1] = unsafe.Pointer(&s.sc.ns), unsafe.Pointer(&s.sc.at)
	return s, nil
}

// Spin queues on stream a kernel that runs for ns nanoseconds (nothing for
// ns <= 0): work queued after it on the stream starts that much later. The
// timer ticks at about a microsecond on some GPUs, so short spins round up
// to it. It makes no allocation.
func (s *Spinner) Spin(stream device.Stream, ns int64) error {
	if ns <= 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spin: %w", device.ErrClosed)
	}
	s.sc.ns = uint64(ns)
	if err := s.c.Launch(s.fn, Dim{1, 1, 1}, Dim{1, 1, 1}, 0, stream, unsafe.Pointer(&s.sc.ptr[0])); err != nil {
		return fmt.Errorf("spin %d ns on stream %#x: %w", ns, uintptr(stream), err)
	}
	return nil
}

// SpinAt is Spin that also writes, into the two 64-bit words of device
// memory at at, the global timer's nanoseconds when the kernel started and
// when it ended. It launches for ns <= 0 too (a kernel of no time), so
// every call leaves its stamps. It makes no allocation.
func (s *Spinner) SpinAt(stream device.Stream, ns int64, at device.DevPtr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("spin: %w", device.ErrClosed)
	}
	s.sc.ns, s.sc.at = uint64(max(ns, 0)), uint64(at)
	if err := s.c.Launch(s.fnAt, Dim{1, 1, 1}, Dim{1, 1, 1}, 0, stream, unsafe.Pointer(&s.sc.ptrAt[0])); err != nil {
		return fmt.Errorf("spin %d ns on stream %#x: %w", ns, uintptr(stream), err)
	}
	return nil
}

// Close unloads the kernel. Synchronize the streams it spun on first.
func (s *Spinner) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.pin.Unpin()
	return s.mod.Unload()
}
