package ascend

import (
	"fmt"
	"unsafe"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/native"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// Constants from acl_rt.h (CANN; hicann/runtime include/external/acl/acl_rt.h).
const (
	memMallocHugeFirst   = 0                     // ACL_MEM_MALLOC_HUGE_FIRST: huge pages when the size allows
	memcpyHostToDevice   = native.HostToDevice   // ACL_MEMCPY_HOST_TO_DEVICE
	memcpyDeviceToHost   = native.DeviceToHost   // ACL_MEMCPY_DEVICE_TO_HOST
	memcpyDeviceToDevice = native.DeviceToDevice // ACL_MEMCPY_DEVICE_TO_DEVICE
	hbmMem               = 1                     // ACL_HBM_MEM, the aclrtMemAttr for device memory in aclrtGetMemInfo
)

type memoryFuncs struct {
	// aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
	aclrtMalloc func(devPtr *uintptr, size uintptr, policy int32) int32
	// aclError aclrtFree(void *devPtr);
	aclrtFree func(devPtr uintptr) int32
	// aclError aclrtMallocHost(void **hostPtr, size_t size);
	aclrtMallocHost func(hostPtr *unsafe.Pointer, size uintptr) int32
	// aclError aclrtFreeHost(void *hostPtr);
	aclrtFreeHost func(hostPtr unsafe.Pointer) int32
	// aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
	//                           aclrtMemcpyKind kind, aclrtStream stream);
	aclrtMemcpyAsync func(dst, destMax, src, count uintptr, kind int32, stream uintptr) int32
	// aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
	// Bound twice so that Go memory is passed as unsafe.Pointer.
	aclrtMemcpyToHost   func(dst unsafe.Pointer, destMax, src, count uintptr, kind int32) int32
	aclrtMemcpyToDevice func(dst, destMax uintptr, src unsafe.Pointer, count uintptr, kind int32) int32
	// aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);
	aclrtGetMemInfo func(attr int32, free, total *uintptr) int32
}

func (f *memoryFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.aclrtMalloc, Name: "aclrtMalloc"},
		dl.Func{Ptr: &f.aclrtFree, Name: "aclrtFree"},
		dl.Func{Ptr: &f.aclrtMallocHost, Name: "aclrtMallocHost"},
		dl.Func{Ptr: &f.aclrtFreeHost, Name: "aclrtFreeHost"},
		dl.Func{Ptr: &f.aclrtMemcpyAsync, Name: "aclrtMemcpyAsync"},
		dl.Func{Ptr: &f.aclrtMemcpyToHost, Name: "aclrtMemcpy"},
		dl.Func{Ptr: &f.aclrtMemcpyToDevice, Name: "aclrtMemcpy"},
		dl.Func{Ptr: &f.aclrtGetMemInfo, Name: "aclrtGetMemInfo"},
	)
	if err != nil {
		return err
	}
	addr, err := l.Sym("aclrtMemcpyAsync")
	if err != nil {
		return err
	}
	f.aclrtMemcpyAsync = func(dst, destMax, src, count uintptr, kind int32, stream uintptr) int32 {
		return fastCall(addr, dst, destMax, src, count, uintptr(kind), stream)
	}
	return nil
}

// Alloc implements device.Device with aclrtMalloc.
func (d *Device) Alloc(size int64) (device.DevPtr, error) {
	if err := d.enter("alloc"); err != nil {
		return 0, err
	}
	defer d.leave()
	if size <= 0 {
		return 0, fmt.Errorf("ascend: alloc %d bytes: %w", size, device.ErrInvalidValue)
	}
	var p uintptr
	if rc := d.api.aclrtMalloc(&p, uintptr(size), memMallocHugeFirst); rc != 0 {
		return 0, fmt.Errorf("ascend: alloc %d bytes: %w", size, fail("aclrtMalloc", rc))
	}
	return device.DevPtr(p), nil
}

// Free implements device.Device with aclrtFree.
func (d *Device) Free(p device.DevPtr) error {
	if err := d.enter("free"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.aclrtFree(uintptr(p)); rc != 0 {
		return fmt.Errorf("ascend: free %#x: %w", uintptr(p), fail("aclrtFree", rc))
	}
	return nil
}

// AllocHost implements device.Device with aclrtMallocHost (page-locked).
func (d *Device) AllocHost(size int64) (device.HostBuf, error) {
	if err := d.enter("alloc host"); err != nil {
		return device.HostBuf{}, err
	}
	defer d.leave()
	if size <= 0 {
		return device.HostBuf{}, fmt.Errorf("ascend: alloc host %d bytes: %w", size, device.ErrInvalidValue)
	}
	var p unsafe.Pointer
	if rc := d.api.aclrtMallocHost(&p, uintptr(size)); rc != 0 {
		return device.HostBuf{}, fmt.Errorf("ascend: alloc host %d bytes: %w", size, fail("aclrtMallocHost", rc))
	}
	return device.WrapHost(unsafe.Slice((*byte)(p), size)), nil
}

// FreeHost implements device.Device with aclrtFreeHost.
func (d *Device) FreeHost(b device.HostBuf) error {
	if err := d.enter("free host"); err != nil {
		return err
	}
	defer d.leave()
	if rc := d.api.aclrtFreeHost(b.Ptr()); rc != 0 {
		return fmt.Errorf("ascend: free host %p: %w", b.Ptr(), fail("aclrtFreeHost", rc))
	}
	return nil
}

// ReadDevice implements device.Device: aclrtSynchronizeDevice, then aclrtMemcpy.
func (d *Device) ReadDevice(dst []byte, src device.DevPtr) error {
	n := uintptr(len(dst))
	return d.syncCopy("read device", src, len(dst), func() int32 {
		return d.api.aclrtMemcpyToHost(unsafe.Pointer(&dst[0]), n, uintptr(src), n, memcpyDeviceToHost)
	})
}

// WriteDevice implements device.Device: aclrtSynchronizeDevice, then aclrtMemcpy.
func (d *Device) WriteDevice(dst device.DevPtr, src []byte) error {
	n := uintptr(len(src))
	return d.syncCopy("write device", dst, len(src), func() int32 {
		return d.api.aclrtMemcpyToDevice(uintptr(dst), n, unsafe.Pointer(&src[0]), n, memcpyHostToDevice)
	})
}

// syncCopy waits for the whole device, then runs copy, an aclrtMemcpy of n
// bytes at p (none when n is 0).
func (d *Device) syncCopy(what string, p device.DevPtr, n int, copy func() int32) error {
	if err := d.enter(what); err != nil {
		return err
	}
	defer d.leave()
	if err := check("aclrtSynchronizeDevice", d.api.aclrtSynchronizeDevice()); err != nil {
		return fmt.Errorf("ascend: %s: %w", what, err)
	}
	if n == 0 {
		return nil
	}
	if err := check("aclrtMemcpy", copy()); err != nil {
		return fmt.Errorf("ascend: %s %#x+%d: %w", what, uintptr(p), n, err)
	}
	return nil
}

// MemInfo implements device.Device with aclrtGetMemInfo(ACL_HBM_MEM).
func (d *Device) MemInfo() (free, total int64, err error) {
	if err := d.enter("mem info"); err != nil {
		return 0, 0, err
	}
	defer d.leave()
	var f, t uintptr
	if rc := d.api.aclrtGetMemInfo(hbmMem, &f, &t); rc != 0 {
		return 0, 0, fail("aclrtGetMemInfo", rc)
	}
	return int64(f), int64(t), nil
}
