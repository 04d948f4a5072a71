package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/device/internal/native"
)

var (
	_ device.Mapper    = (*Device)(nil)
	_ device.Remapper  = (*Device)(nil)
	_ device.PageSizer = (*Device)(nil)
)

// vmm is the device's Mapper over the driver API's virtual memory
// management, in the primary context libcudart uses: address space from
// cuMemAddressReserve, and behind each mapped page its own cuMemCreate
// allocation, so that any run of pages can be unmapped (cuMemUnmap takes
// whole mappings only).
type vmm struct {
	ctx *driver.Context
	v   *driver.VMM

	mu   sync.Mutex // the reservations and the scratch
	res  native.Reservations
	sc   *vmmScratch
	srcs []uintptr // Remap's scratch
	// granule is the driver's granularity; fixed says WithPageSize set
	// the page size, which SizePages then keeps.
	granule int64
	fixed   bool
}

// vmmScratch holds what the driver calls read and write through
// pointers: heap memory, made once, so that the calls allocate nothing.
type vmmScratch struct {
	prop   driver.AllocationProp
	access driver.AccessDesc
	handle uint64
	ptr    uintptr
}

// newVMM loads libcuda from paths and sets up mapping on the device with
// the given ordinal; the error says why it cannot.
func newVMM(paths []string, ordinal int, want int64) (*vmm, error) {
	drv, err := driver.Load(paths...)
	if err != nil {
		return nil, err
	}
	v, err := drv.VMM()
	if err != nil {
		return nil, err
	}
	ctx, err := drv.Primary(ordinal)
	if err != nil {
		return nil, err
	}
	m := &vmm{ctx: ctx, v: v, sc: &vmmScratch{prop: driver.DeviceMemory(ordinal), access: driver.ReadWrite(ordinal)}}
	var page uintptr
	err = ctx.Do("cuMemGetAllocationGranularity", func() int32 { return v.Granularity(&m.sc.ptr, &m.sc.prop) })
	page, m.sc.ptr = m.sc.ptr, 0
	if err == nil && (page == 0 || page&(page-1) != 0) {
		err = fmt.Errorf("granularity %d is not a power of two: %w", page, device.ErrNotSupported)
	}
	if err == nil && want != 0 {
		if want < int64(page) || want&(want-1) != 0 {
			err = fmt.Errorf("page size %d: want a power of two of at least the granularity %d: %w", want, page, device.ErrInvalidValue)
		} else {
			page = uintptr(want)
		}
	}
	if err != nil {
		return nil, errors.Join(err, ctx.Release())
	}
	m.res = native.Reservations{Backend: "cuda", Page: int64(page)}
	m.granule, m.fixed = int64(page), want != 0
	return m, nil
}

// MapPage implements native.PageOps: cuMemCreate of one page, cuMemMap.
func (m *vmm) MapPage(addr uintptr) (uintptr, error) {
	page := uintptr(m.res.Page)
	if err := m.ctx.Driver().Check("cuMemCreate", m.v.Create(&m.sc.handle, page, &m.sc.prop)); err != nil {
		return 0, err
	}
	h := m.sc.handle
	if err := m.ctx.Driver().Check("cuMemMap", m.v.Map(addr, page, h)); err != nil {
		return 0, errors.Join(err, m.ctx.Driver().Check("cuMemRelease", m.v.Release(h)))
	}
	return uintptr(h), nil
}

// Access implements native.PageOps with cuMemSetAccess.
func (m *vmm) Access(addr uintptr, size int64) error {
	return m.ctx.Driver().Check("cuMemSetAccess", m.v.SetAccess(addr, uintptr(size), &m.sc.access))
}

// UnmapPage implements native.PageOps: cuMemUnmap, cuMemRelease.
func (m *vmm) UnmapPage(addr, h uintptr) error {
	drv := m.ctx.Driver()
	if err := drv.Check("cuMemUnmap", m.v.Unmap(addr, uintptr(m.res.Page))); err != nil {
		return err
	}
	return drv.Check("cuMemRelease", m.v.Release(uint64(h)))
}

// PageSize implements device.Mapper: the driver's minimum granularity of
// pinned device memory (2 MiB on current GPUs), or 0 when the device does
// not map (see Mapping).
func (d *Device) PageSize() int64 {
	if d.vmm == nil {
		return 0
	}
	return d.vmm.res.Page
}

// Mapping reports why the device does not map pages (nil when it does):
// WithoutMapping, or a libcuda that could not be loaded or lacks the calls.
func (d *Device) Mapping() error { return d.mapErr }

// Context returns the driver API's handle on the primary context of the
// device, for launching kernels (driver.NewSpinner) on its streams (also
// under WithoutMapping, where libcuda loads), or the reason there is none.
func (d *Device) Context() (*driver.Context, error) {
	switch {
	case d.vmm != nil:
		return d.vmm.ctx, nil
	case d.ctx != nil:
		return d.ctx, nil
	}
	return nil, d.mapErr
}

// mapping brackets a Mapper call: d open, its device current for
// libcudart, the primary context current for the driver, and m.mu held.
func (d *Device) mapping(what string) (*vmm, error) {
	if d.vmm == nil {
		return nil, fmt.Errorf("cuda: %s: cannot map pages: %w: %w", what, d.mapErr, device.ErrNotSupported)
	}
	if err := d.enter(what); err != nil {
		return nil, err
	}
	if err := d.vmm.ctx.Enter(); err != nil {
		d.leave()
		return nil, fmt.Errorf("cuda: %s: %w", what, err)
	}
	d.vmm.mu.Lock()
	return d.vmm, nil
}

func (d *Device) unmapping() {
	d.vmm.mu.Unlock()
	d.vmm.ctx.Leave()
	d.leave()
}

// ReserveAddress implements device.Mapper with cuMemAddressReserve.
func (d *Device) ReserveAddress(size int64) (device.DevPtr, error) {
	m, err := d.mapping("reserve address")
	if err != nil {
		return 0, err
	}
	defer d.unmapping()
	if size <= 0 || size%m.res.Page != 0 {
		return 0, fmt.Errorf("cuda: reserve address %d bytes: not a multiple of the page size %d: %w", size, m.res.Page, device.ErrInvalidValue)
	}
	if err := m.ctx.Driver().Check("cuMemAddressReserve", m.v.Reserve(&m.sc.ptr, uintptr(size))); err != nil {
		return 0, fmt.Errorf("cuda: reserve address %d bytes: %w", size, err)
	}
	p := m.sc.ptr
	m.res.Add(p, size)
	return device.DevPtr(p), nil
}

// ReleaseAddress implements device.Mapper: cudaDeviceSynchronize, then
// cuMemUnmap and cuMemRelease of every page still mapped, then
// cuMemAddressFree.
func (d *Device) ReleaseAddress(p device.DevPtr) error {
	m, err := d.mapping("release address")
	if err != nil {
		return err
	}
	defer d.unmapping()
	if err := check("cudaDeviceSynchronize", d.api.cudaDeviceSynchronize()); err != nil {
		return fmt.Errorf("cuda: release address %#x: %w", uintptr(p), err)
	}
	size, err := m.res.Release(m, uintptr(p))
	if size > 0 {
		err = errors.Join(err, m.ctx.Driver().Check("cuMemAddressFree", m.v.Free(uintptr(p), uintptr(size))))
	}
	if err != nil {
		return fmt.Errorf("cuda: release address %#x: %w", uintptr(p), err)
	}
	return nil
}

// Map implements device.Mapper: per page cuMemCreate and cuMemMap, then
// one cuMemSetAccess for the range. It allocates nothing.
func (d *Device) Map(p device.DevPtr, size int64) error {
	m, err := d.mapping("map")
	if err != nil {
		return err
	}
	defer d.unmapping()
	return m.res.Map(m, uintptr(p), size)
}

// Unmap implements device.Mapper: per page cuMemUnmap and cuMemRelease.
func (d *Device) Unmap(p device.DevPtr, size int64) error {
	m, err := d.mapping("unmap")
	if err != nil {
		return err
	}
	defer d.unmapping()
	return m.res.Unmap(m, uintptr(p), size)
}

// UnmapOnly implements native.PageMover: cuMemUnmap, the allocation kept.
func (m *vmm) UnmapOnly(addr, h uintptr) error {
	return m.ctx.Driver().Check("cuMemUnmap", m.v.Unmap(addr, uintptr(m.res.Page)))
}

// MapHandle implements native.PageMover: cuMemMap of an allocation kept.
func (m *vmm) MapHandle(addr, h uintptr) error {
	return m.ctx.Driver().Check("cuMemMap", m.v.Map(addr, uintptr(m.res.Page), uint64(h)))
}

// Remap implements device.Remapper: per page cuMemUnmap and cuMemMap of
// the same allocation at its new address, then one cuMemSetAccess for the
// range; no cuMemRelease or cuMemCreate.
func (d *Device) Remap(dst device.DevPtr, srcs []device.DevPtr) error {
	m, err := d.mapping("remap")
	if err != nil {
		return err
	}
	defer d.unmapping()
	m.srcs = m.srcs[:0]
	for _, s := range srcs {
		m.srcs = append(m.srcs, uintptr(s))
	}
	return m.res.Move(m, uintptr(dst), m.srcs)
}

// SizePages implements device.PageSizer: unless WithPageSize set the page
// size, and while no address is reserved, pages are the largest power of
// two at most limit/1024 bytes, between the driver's granularity and
// DefaultPageSize: 16 MiB for a limit of 16 GiB and more, 2 MiB at 2 GiB
// and less.
func (d *Device) SizePages(limit int64) {
	m, err := d.mapping("size pages")
	if err != nil {
		return
	}
	defer d.unmapping()
	if m.fixed || m.res.Len() > 0 {
		return
	}
	m.res.Page = device.PageFor(limit, m.granule, DefaultPageSize)
}
