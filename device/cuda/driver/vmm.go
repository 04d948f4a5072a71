package driver

import (
	"fmt"
	"unsafe"

	"github.com/chameleon-go/chameleon/internal/dl"
)

// VMM is the driver API's virtual memory management (CUDA 10.2 and
// later): address space reserved without memory, physical allocations
// mapped into it. Its calls need the context current (Context.Enter) and
// make no allocation: they are called through purego.SyscallN, and every
// pointer they take is the caller's, which must be heap memory (a field of
// a value made with new, not a local variable).
type VMM struct {
	// CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
	//                                        CUmemAllocationGranularity_flags option);
	granularity uintptr
	// CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
	//                              unsigned long long flags);
	reserve uintptr
	// CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
	free uintptr
	// CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
	//                      unsigned long long flags);
	create uintptr
	// CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
	release uintptr
	// CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
	//                   unsigned long long flags);
	mmap uintptr
	// CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
	unmap uintptr
	// CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
	setAccess uintptr
}

func loadVMM(lib *dl.Library) (*VMM, error) {
	v := &VMM{}
	for _, s := range []struct {
		p    *uintptr
		name string
	}{
		{&v.granularity, "cuMemGetAllocationGranularity"},
		{&v.reserve, "cuMemAddressReserve"},
		{&v.free, "cuMemAddressFree"},
		{&v.create, "cuMemCreate"},
		{&v.release, "cuMemRelease"},
		{&v.mmap, "cuMemMap"},
		{&v.unmap, "cuMemUnmap"},
		{&v.setAccess, "cuMemSetAccess"},
	} {
		p, err := Sym(lib, s.name)
		if err != nil {
			return nil, fmt.Errorf("driver: virtual memory management: %w", err)
		}
		*s.p = p
	}
	return v, nil
}

// VMM returns the virtual memory management calls, or an error wrapping
// ErrLibrary when the library lacks one of them.
func (d *Driver) VMM() (*VMM, error) { return d.vmm, d.vmmErr }

// AllocationProp is CUmemAllocationProp (cuda.h, CUDA 10.2 to 13): 32
// bytes, the type, the requested handle types, the location (type, id),
// win32HandleMetaData and allocFlags.
type AllocationProp struct {
	Type        uint32
	HandleTypes uint32
	LocType     uint32
	LocID       int32
	Win32       uintptr
	Flags       [8]byte
}

// AccessDesc is CUmemAccessDesc: a location and its access flags.
type AccessDesc struct {
	LocType uint32
	LocID   int32
	Flags   uint32
}

// Enum values of cuda.h.
const (
	allocationTypePinned = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	locationTypeDevice   = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	granularityMinimum   = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	accessFlagsReadWrite = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	allocationPropSize   = 32
	accessDescSize       = 12
	_                    = uint(allocationPropSize - unsafe.Sizeof(AllocationProp{})) // the layout is C's
	_                    = uint(unsafe.Sizeof(AllocationProp{}) - allocationPropSize)
	_                    = uint(accessDescSize - unsafe.Sizeof(AccessDesc{}))
	_                    = uint(unsafe.Sizeof(AccessDesc{}) - accessDescSize)
)

// DeviceMemory is the property of pinned memory on the device with the
// given ordinal, and ReadWrite the access that device gets to it.
func DeviceMemory(ordinal int) AllocationProp {
	return AllocationProp{Type: allocationTypePinned, LocType: locationTypeDevice, LocID: int32(ordinal)}
}

// ReadWrite is the access descriptor giving the device read and write access.
func ReadWrite(ordinal int) AccessDesc {
	return AccessDesc{LocType: locationTypeDevice, LocID: int32(ordinal), Flags: accessFlagsReadWrite}
}

// Granularity is cuMemGetAllocationGranularity's minimum granularity for
// prop, stored in *out.
func (v *VMM) Granularity(out *uintptr, prop *AllocationProp) int32 {
	return call(v.granularity, uintptr(unsafe.Pointer(out)), uintptr(unsafe.Pointer(prop)), granularityMinimum)
}

// Reserve is cuMemAddressReserve of size bytes at no particular address
// and the default alignment, stored in *out.
func (v *VMM) Reserve(out *uintptr, size uintptr) int32 {
	return call(v.reserve, uintptr(unsafe.Pointer(out)), size, 0, 0, 0)
}

// Free is cuMemAddressFree.
func (v *VMM) Free(p, size uintptr) int32 { return call(v.free, p, size) }

// Create is cuMemCreate of size bytes with prop, the handle stored in *out.
func (v *VMM) Create(out *uint64, size uintptr, prop *AllocationProp) int32 {
	return call(v.create, uintptr(unsafe.Pointer(out)), size, uintptr(unsafe.Pointer(prop)), 0)
}

// Release is cuMemRelease.
func (v *VMM) Release(h uint64) int32 { return call(v.release, uintptr(h)) }

// Map is cuMemMap of the whole allocation h at p.
func (v *VMM) Map(p, size uintptr, h uint64) int32 { return call(v.mmap, p, size, 0, uintptr(h), 0) }

// Unmap is cuMemUnmap.
func (v *VMM) Unmap(p, size uintptr) int32 { return call(v.unmap, p, size) }

// SetAccess is cuMemSetAccess with one descriptor.
func (v *VMM) SetAccess(p, size uintptr, desc *AccessDesc) int32 {
	return call(v.setAccess, p, size, uintptr(unsafe.Pointer(desc)), 1)
}
