package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/native"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// cudaMemcpyKind values (driver_types.h), as native.Copies passes them.
const (
	memcpyHostToDevice   = native.HostToDevice
	memcpyDeviceToHost   = native.DeviceToHost
	memcpyDeviceToDevice = native.DeviceToDevice
)

// cudaHostAllocDefault: plain page-locked memory. Portable or mapped memory
// is not needed for copies issued on one device.
const hostAllocDefault = 0

type memoryFuncs struct {
	// cudaError_t cudaMalloc(void **devPtr, size_t size);
	cudaMalloc func(devPtr *uintptr, size uintptr) int32
	// cudaError_t cudaFree(void *devPtr);
	cudaFree func(devPtr uintptr) int32
	// cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
	cudaHostAlloc func(pHost *unsafe.Pointer, size uintptr, flags uint32) int32
	// cudaError_t cudaFreeHost(void *ptr);
	cudaFreeHost func(ptr unsafe.Pointer) int32
	// cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
	//                             enum cudaMemcpyKind kind, cudaStream_t stream);
	// Host addresses passed here are pinned C memory, so uintptr is safe.
	cudaMemcpyAsync func(dst, src, count uintptr, kind int32, stream uintptr) int32
	// cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
	// Bound twice so that Go memory is passed as unsafe.Pointer and kept
	// alive for the call.
	cudaMemcpyToHost   func(dst unsafe.Pointer, src, count uintptr, kind int32) int32
	cudaMemcpyToDevice func(dst uintptr, src unsafe.Pointer, count uintptr, kind int32) int32
	// cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
	cudaMemGetInfo func(free, total *uintptr) int32
}

func (f *memoryFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.cudaMalloc, Name: "cudaMalloc"},
		dl.Func{Ptr: &f.cudaFree, Name: "cudaFree"},
		dl.Func{Ptr: &f.cudaHostAlloc, Name: "cudaHostAlloc"},
		dl.Func{Ptr: &f.cudaFreeHost, Name: "cudaFreeHost"},
		dl.Func{Ptr: &f.cudaMemcpyAsync, Name: "cudaMemcpyAsync"},
		dl.Func{Ptr: &f.cudaMemcpyToHost, Name: "cudaMemcpy"},
		dl.Func{Ptr: &f.cudaMemcpyToDevice, Name: "cudaMemcpy"},
		dl.Func{Ptr: &f.cudaMemGetInfo, Name: "cudaMemGetInfo"},
	)
	if err != nil {
		return err
	}
	addr, err := l.Sym("cudaMemcpyAsync")
	if err != nil {
		return err
	}
	// Hot path: see fastCall.
	f.cudaMemcpyAsync = func(dst, src, count uintptr, kind int32, stream uintptr) int32 {
		return fastCall(addr, dst, src, count, uintptr(kind), stream)
	}
	return nil
}

// fastCall calls a C function that takes only integer and pointer-sized
// arguments and returns an int32 status. The swap hot path (copy, record,
// wait, query) goes through it instead of the RegisterFunc binding: the
// reflection behind RegisterFunc costs about 0.4-1.3 us and 4 allocations a
// call, purego.SyscallN about 0.1 us, against a 5 us budget per swap.
func fastCall(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r) // cudaError_t is a C enum: the low 32 bits of the return register
}

// Alloc implements device.Device with cudaMalloc.
func (d *Device) Alloc(size int64) (device.DevPtr, error) {
	if err := d.enter("alloc"); err != nil {
		return 0, err
	}
	defer d.leave()
	if size <= 0 {
		return 0, fmt.Errorf("cuda: alloc %d bytes: %w", size, device.ErrInvalidValue)
	}
	var p uintptr
	if rc := d.api.cudaMalloc(&p, uintptr(size)); rc != 0 {
		return 0, fmt.Errorf("cuda: alloc %d bytes: %w", size, fail("cudaMalloc", rc))
	}
	return device.DevPtr(p), nil
}

// Free implements device.Device with cudaFree, which synchronizes the device.
func (d *Device) Free(p device.DevPtr) error {
	if err := d.enter("free"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.cudaFree(uintptr(p)); rc != 0 {
		return fmt.Errorf("cuda: free %#x: %w", uintptr(p), fail("cudaFree", rc))
	}
	return nil
}

// AllocHost implements device.Device with cudaHostAlloc.
func (d *Device) AllocHost(size int64) (device.HostBuf, error) {
	if err := d.enter("alloc host"); err != nil {
		return device.HostBuf{}, err
	}
	defer d.leave()
	if size <= 0 {
		return device.HostBuf{}, fmt.Errorf("cuda: alloc host %d bytes: %w", size, device.ErrInvalidValue)
	}
	var p unsafe.Pointer
	if rc := d.api.cudaHostAlloc(&p, uintptr(size), hostAllocDefault); rc != 0 {
		return device.HostBuf{}, fmt.Errorf("cuda: alloc host %d bytes: %w", size, fail("cudaHostAlloc", rc))
	}
	return device.WrapHost(unsafe.Slice((*byte)(p), size)), nil
}

// FreeHost implements device.Device with cudaFreeHost.
func (d *Device) FreeHost(b device.HostBuf) error {
	if err := d.enter("free host"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.cudaFreeHost(b.Ptr()); rc != 0 {
		return fmt.Errorf("cuda: free host %p: %w", b.Ptr(), fail("cudaFreeHost", rc))
	}
	return nil
}

// ReadDevice implements device.Device: cudaDeviceSynchronize, then cudaMemcpy.
// The device-wide sync is needed because cudaMemcpy orders only after the
// legacy default stream, not after non-blocking streams.
func (d *Device) ReadDevice(dst []byte, src device.DevPtr) error {
	return d.syncCopy("read device", src, len(dst), func() int32 {
		return d.api.cudaMemcpyToHost(unsafe.Pointer(&dst[0]), uintptr(src), uintptr(len(dst)), memcpyDeviceToHost)
	})
}

// WriteDevice implements device.Device: cudaDeviceSynchronize, then cudaMemcpy.
func (d *Device) WriteDevice(dst device.DevPtr, src []byte) error {
	return d.syncCopy("write device", dst, len(src), func() int32 {
		return d.api.cudaMemcpyToDevice(uintptr(dst), unsafe.Pointer(&src[0]), uintptr(len(src)), memcpyHostToDevice)
	})
}

// syncCopy waits for the whole device, then runs copy, a cudaMemcpy of n
// bytes at p (none when n is 0).
func (d *Device) syncCopy(what string, p device.DevPtr, n int, copy func() int32) error {
	if err := d.enter(what); err != nil {
		return err
	}
	defer d.leave()
	if err := check("cudaDeviceSynchronize", d.api.cudaDeviceSynchronize()); err != nil {
		return fmt.Errorf("cuda: %s: %w", what, err)
	}
	if n == 0 {
		return nil
	}
	if err := check("cudaMemcpy", copy()); err != nil {
		return fmt.Errorf("cuda: %s %#x+%d: %w", what, uintptr(p), n, err)
	}
	return nil
}

// MemInfo implements device.Device with cudaMemGetInfo.
func (d *Device) MemInfo() (free, total int64, err error) {
	if err := d.enter("mem info"); err != nil {
		return 0, 0, err
	}
	defer d.leave()
	var f, t uintptr
	if rc := d.api.cudaMemGetInfo(&f, &t); rc != 0 {
		return 0, 0, fail("cudaMemGetInfo", rc)
	}
	return int64(f), int64(t), nil
}
