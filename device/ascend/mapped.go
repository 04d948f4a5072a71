package ascend

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/native"
	"github.com/chameleon-go/chameleon/internal/dl"
)

var _ device.Mapper = (*Device)(nil)

// physicalMemProp is aclrtPhysicalMemProp (acl_rt.h): the handle type, the
// allocation type, the memory attribute, the location (id, type) and a
// reserved word; 32 bytes.
type physicalMemProp struct {
	handleType     uint32
	allocationType uint32
	memAttr        uint32
	locID          uint32
	locType        uint32
	_              uint32
	reserve        uint64
}

// Enum values of acl_rt.h.
const (
	memHandleTypeNone          = 0 // ACL_MEM_HANDLE_TYPE_NONE
	memAllocationTypePinned    = 0 // ACL_MEM_ALLOCATION_TYPE_PINNED
	hbmMemHuge                 = 4 // ACL_HBM_MEM_HUGE: 2 MiB pages of HBM
	memLocationTypeDevice      = 1 // ACL_MEM_LOCATION_TYPE_DEVICE
	memAllocGranularityMinimum = 0 // ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM
)

// vmmFuncs are AscendCL's virtual memory calls (CANN 8), optional: a
// library without them leaves the device without mapping. They are called
// through fastCall with pointers to heap memory.
type vmmFuncs struct {
	// aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop,
	//     aclrtMemGranularityOptions option, size_t *granularity);
	granularity uintptr
	// aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags);
	reserve uintptr
	// aclError aclrtReleaseMemAddress(void *virPtr);
	release uintptr
	// aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop, uint64_t flags);
	mallocPhysical uintptr
	// aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
	freePhysical uintptr
	// aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags);
	mapMem uintptr
	// aclError aclrtUnmapMem(void *virPtr);
	unmapMem uintptr
}

func loadVMM(l *dl.Library) (*vmmFuncs, error) {
	f := &vmmFuncs{}
	for _, s := range []struct {
		p    *uintptr
		name string
	}{
		{&f.granularity, "aclrtMemGetAllocationGranularity"},
		{&f.reserve, "aclrtReserveMemAddress"},
		{&f.release, "aclrtReleaseMemAddress"},
		{&f.mallocPhysical, "aclrtMallocPhysical"},
		{&f.freePhysical, "aclrtFreePhysical"},
		{&f.mapMem, "aclrtMapMem"},
		{&f.unmapMem, "aclrtUnmapMem"},
	} {
		p, err := l.Sym(s.name)
		if err != nil {
			return nil, fmt.Errorf("ascend: virtual memory management: %w", err)
		}
		*s.p = p
	}
	return f, nil
}

// vmm is the device's Mapper: address space from aclrtReserveMemAddress
// and, behind each mapped page, its own aclrtMallocPhysical allocation, so
// that any run of pages can be unmapped (aclrtUnmapMem unmaps one whole
// mapping, named by its address).
type vmm struct {
	f *vmmFuncs

	mu  sync.Mutex // the reservations and the scratch
	res native.Reservations
	sc  *vmmScratch
}

// vmmScratch holds what the calls write through pointers: heap memory.
type vmmScratch struct {
	prop   physicalMemProp
	handle uintptr
	ptr    uintptr
}

// newVMM sets mapping up on the device whose context is current. Called
// between enter and leave.
func newVMM(f *vmmFuncs, id int) (*vmm, error) {
	m := &vmm{f: f, sc: &vmmScratch{prop: physicalMemProp{handleType: memHandleTypeNone,
		allocationType: memAllocationTypePinned, memAttr: hbmMemHuge, locID: uint32(id), locType: memLocationTypeDevice}}}
	if err := check("aclrtMemGetAllocationGranularity", fastCall(f.granularity,
		uintptr(unsafe.Pointer(&m.sc.prop)), memAllocGranularityMinimum, uintptr(unsafe.Pointer(&m.sc.ptr)))); err != nil {
		return nil, err
	}
	page := m.sc.ptr
	if page == 0 || page&(page-1) != 0 {
		return nil, fmt.Errorf("ascend: granularity %d is not a power of two: %w", page, device.ErrNotSupported)
	}
	m.res = native.Reservations{Backend: "ascend", Page: int64(page)}
	return m, nil
}

// MapPage implements native.PageOps: aclrtMallocPhysical of one page,
// aclrtMapMem.
func (m *vmm) MapPage(addr uintptr) (uintptr, error) {
	page := uintptr(m.res.Page)
	if err := check("aclrtMallocPhysical", fastCall(m.f.mallocPhysical,
		uintptr(unsafe.Pointer(&m.sc.handle)), page, uintptr(unsafe.Pointer(&m.sc.prop)), 0)); err != nil {
		return 0, err
	}
	h := m.sc.handle
	if err := check("aclrtMapMem", fastCall(m.f.mapMem, addr, page, 0, h, 0)); err != nil {
		return 0, errors.Join(err, check("aclrtFreePhysical", fastCall(m.f.freePhysical, h)))
	}
	return h, nil
}

// Access implements native.PageOps: AscendCL maps memory accessible.
func (m *vmm) Access(uintptr, int64) error { return nil }

// UnmapPage implements native.PageOps: aclrtUnmapMem, aclrtFreePhysical.
func (m *vmm) UnmapPage(addr, h uintptr) error {
	if err := check("aclrtUnmapMem", fastCall(m.f.unmapMem, addr)); err != nil {
		return err
	}
	return check("aclrtFreePhysical", fastCall(m.f.freePhysical, h))
}

// PageSize implements device.Mapper: AscendCL's minimum granularity of
// huge-page HBM (2 MiB), or 0 when the device does not map (see Mapping).
func (d *Device) PageSize() int64 {
	if d.vmm == nil {
		return 0
	}
	return d.vmm.res.Page
}

// Mapping reports why the device does not map pages (nil when it does):
// WithoutMapping, or an AscendCL without the calls.
func (d *Device) Mapping() error { return d.mapErr }

// mapping brackets a Mapper call: d open, its context current, m.mu held.
func (d *Device) mapping(what string) (*vmm, error) {
	if d.vmm == nil {
		return nil, fmt.Errorf("ascend: %s: cannot map pages: %w: %w", what, d.mapErr, device.ErrNotSupported)
	}
	if err := d.enter(what); err != nil {
		return nil, err
	}
	d.vmm.mu.Lock()
	return d.vmm, nil
}

func (d *Device) unmapping() {
	d.vmm.mu.Unlock()
	d.leave()
}

// ReserveAddress implements device.Mapper with aclrtReserveMemAddress.
func (d *Device) ReserveAddress(size int64) (device.DevPtr, error) {
	m, err := d.mapping("reserve address")
	if err != nil {
		return 0, err
	}
	defer d.unmapping()
	if size <= 0 || size%m.res.Page != 0 {
		return 0, fmt.Errorf("ascend: reserve address %d bytes: not a multiple of the page size %d: %w", size, m.res.Page, device.ErrInvalidValue)
	}
	if err := check("aclrtReserveMemAddress", fastCall(m.f.reserve, uintptr(unsafe.Pointer(&m.sc.ptr)), uintptr(size), 0, 0, 0)); err != nil {
		return 0, fmt.Errorf("ascend: reserve address %d bytes: %w", size, err)
	}
	p := m.sc.ptr
	m.res.Add(p, size)
	return device.DevPtr(p), nil
}

// ReleaseAddress implements device.Mapper: aclrtSynchronizeDevice, then
// aclrtUnmapMem and aclrtFreePhysical of every page still mapped, then
// aclrtReleaseMemAddress.
func (d *Device) ReleaseAddress(p device.DevPtr) error {
	m, err := d.mapping("release address")
	if err != nil {
		return err
	}
	defer d.unmapping()
	if err := check("aclrtSynchronizeDevice", d.api.aclrtSynchronizeDevice()); err != nil {
		return fmt.Errorf("ascend: release address %#x: %w", uintptr(p), err)
	}
	size, err := m.res.Release(m, uintptr(p))
	if size > 0 {
		err = errors.Join(err, check("aclrtReleaseMemAddress", fastCall(m.f.release, uintptr(p))))
	}
	if err != nil {
		return fmt.Errorf("ascend: release address %#x: %w", uintptr(p), err)
	}
	return nil
}

// Map implements device.Mapper: per page aclrtMallocPhysical and
// aclrtMapMem.
func (d *Device) Map(p device.DevPtr, size int64) error {
	m, err := d.mapping("map")
	if err != nil {
		return err
	}
	defer d.unmapping()
	return m.res.Map(m, uintptr(p), size)
}

// Unmap implements device.Mapper: per page aclrtUnmapMem and
// aclrtFreePhysical.
func (d *Device) Unmap(p device.DevPtr, size int64) error {
	m, err := d.mapping("unmap")
	if err != nil {
		return err
	}
	defer d.unmapping()
	return m.res.Unmap(m, uintptr(p), size)
}
