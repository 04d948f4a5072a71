package host

import (
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/device"
)

var _ device.Mapper = (*Device)(nil)

// DefaultPageSize is the page size of Map and Unmap unless WithPageSize
// says otherwise: the host's own page.
const DefaultPageSize = 4 << 10

// WithPageSize sets the page size of the device's Mapper (default
// DefaultPageSize), to model a GPU's: CUDA maps 2 MiB pages, so a replay
// that divides tensor sizes by k models the GPU with 2 MiB / k. It must be a
// power of two of at least 512; other values are ignored.
func WithPageSize(n int64) Option {
	return optionFunc(func(c *config) {
		if n >= 512 && n&(n-1) == 0 {
			c.pageSize = n
		}
	})
}

// WithoutMapping turns page mapping off, as on a GPU whose driver has no
// virtual memory management: PageSize returns 0, so an Allocator on the
// device reserves plain segments, and ReserveAddress fails.
func WithoutMapping() Option { return optionFunc(func(c *config) { c.noMap = true }) }

// PageSize implements device.Mapper: 0 under WithoutMapping.
func (d *Device) PageSize() int64 {
	if d.cfg.noMap {
		return 0
	}
	return d.cfg.pageSize
}

// ReserveAddress implements device.Mapper. The range is host address space
// reserved without memory behind it (on Linux; elsewhere ordinary Go memory),
// so only mapped pages count against the capacity and take memory.
func (d *Device) ReserveAddress(size int64) (device.DevPtr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("host: reserve address %d bytes: %w", size, device.ErrClosed)
	}
	if d.cfg.noMap {
		return 0, fmt.Errorf("host: reserve address %d bytes: mapping turned off (WithoutMapping): %w", size, device.ErrInvalidValue)
	}
	page := d.cfg.pageSize
	if size <= 0 || size%page != 0 {
		return 0, fmt.Errorf("host: reserve address %d bytes: not a multiple of the page size %d: %w", size, page, device.ErrInvalidValue)
	}
	mem, err := reserveMem(size)
	if err != nil {
		return 0, fmt.Errorf("host: reserve address %d bytes: %w: %w", size, err, device.ErrOutOfMemory)
	}
	base := (d.nextAddr + uintptr(page) - 1) &^ (uintptr(page) - 1)
	d.nextAddr = base + uintptr(size) + addrAlign
	d.allocs = append(d.allocs, allocation{base: device.DevPtr(base), mem: mem, pages: make([]bool, size/page)})
	return device.DevPtr(base), nil
}

// ReleaseAddress implements device.Mapper.
func (d *Device) ReleaseAddress(p device.DevPtr) error {
	if err := d.syncAll(); err != nil {
		return fmt.Errorf("host: release address %#x: %w", uintptr(p), err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := slices.BinarySearchFunc(d.allocs, p, func(a allocation, p device.DevPtr) int { return compare(a.base, p) })
	if !ok || d.allocs[i].pages == nil {
		return fmt.Errorf("host: release address %#x: not a reservation: %w", uintptr(p), device.ErrInvalidValue)
	}
	a := d.allocs[i]
	for _, m := range a.pages {
		if m {
			d.allocated -= d.cfg.pageSize
		}
	}
	d.allocs = slices.Delete(d.allocs, i, i+1)
	// Copies queued on a stream destroyed since may still run (syncAll
	// waits only for live streams): the range goes back to the system at
	// Close, its memory now.
	discardMem(a.mem)
	d.released = append(d.released, a.mem)
	return nil
}

// Map implements device.Mapper.
func (d *Device) Map(p device.DevPtr, size int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, lo, hi, err := d.pageRange("map", p, size)
	if err != nil {
		return err
	}
	for i := lo; i < hi; i++ {
		if a.pages[i] {
			return fmt.Errorf("host: map %#x+%d: page %d already mapped: %w", uintptr(p), size, i, device.ErrInvalidValue)
		}
	}
	if d.allocated+size > d.capacity {
		return fmt.Errorf("host: map %d bytes with %d of %d in use: %w", size, d.allocated, d.capacity, device.ErrOutOfMemory)
	}
	if err := d.fitsMachine(size); err != nil {
		return fmt.Errorf("host: map %d bytes: %w", size, err)
	}
	for i := lo; i < hi; i++ {
		a.pages[i] = true
	}
	d.allocated += size
	d.peak = max(d.peak, d.allocated)
	return nil
}

// Unmap implements device.Mapper. The memory is given back to the system;
// a later Map of the same pages reads zeros.
func (d *Device) Unmap(p device.DevPtr, size int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, lo, hi, err := d.pageRange("unmap", p, size)
	if err != nil {
		return err
	}
	for i := lo; i < hi; i++ {
		if !a.pages[i] {
			return fmt.Errorf("host: unmap %#x+%d: page %d not mapped: %w", uintptr(p), size, i, device.ErrInvalidValue)
		}
	}
	for i := lo; i < hi; i++ {
		a.pages[i] = false
	}
	d.allocated -= size
	off := int64(p - a.base)
	discardMem(a.mem[off : off+size])
	return nil
}

// pageRange finds the reservation holding the pages [p, p+size). Called
// with d.mu held.
func (d *Device) pageRange(what string, p device.DevPtr, size int64) (allocation, int, int, error) {
	if d.closed {
		return allocation{}, 0, 0, fmt.Errorf("host: %s %#x: %w", what, uintptr(p), device.ErrClosed)
	}
	page := d.cfg.pageSize
	i, found := slices.BinarySearchFunc(d.allocs, p, func(a allocation, p device.DevPtr) int { return compare(a.base, p) })
	if !found {
		i--
	}
	if i < 0 || d.allocs[i].pages == nil || size <= 0 || int64(p-d.allocs[i].base)%page != 0 || size%page != 0 ||
		int64(p-d.allocs[i].base)+size > int64(len(d.allocs[i].mem)) {
		return allocation{}, 0, 0, fmt.Errorf("host: %s %#x+%d: not whole pages of a reservation: %w", what, uintptr(p), size, device.ErrInvalidValue)
	}
	a := d.allocs[i]
	lo := int(int64(p-a.base) / page)
	return a, lo, lo + int(size/page), nil
}

// Remap implements device.Remapper: the pages at srcs are unmapped and
// as many from dst on mapped in one step, the device's memory in use
// unchanged (the bytes are not kept: dst reads zeros).
func (d *Device) Remap(dst device.DevPtr, srcs []device.DevPtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	page := d.cfg.pageSize
	size := int64(len(srcs)) * page
	if size == 0 {
		return nil
	}
	da, dlo, _, err := d.pageRange("remap", dst, size)
	if err != nil {
		return err
	}
	for i := range len(srcs) {
		if da.pages[dlo+i] {
			return fmt.Errorf("host: remap to %#x+%d: page %d already mapped: %w", uintptr(dst), size, dlo+i, device.ErrInvalidValue)
		}
	}
	type at struct {
		a allocation
		i int
	}
	from := make([]at, len(srcs))
	for x, src := range srcs {
		sa, slo, _, err := d.pageRange("remap", src, page)
		if err != nil {
			return err
		}
		if !sa.pages[slo] {
			return fmt.Errorf("host: remap %#x: page not mapped: %w", uintptr(src), device.ErrInvalidValue)
		}
		if sa.base == da.base && slo >= dlo && slo < dlo+len(srcs) {
			return fmt.Errorf("host: remap %#x into %#x+%d: the page is in the range: %w", uintptr(src), uintptr(dst), size, device.ErrInvalidValue)
		}
		from[x] = at{sa, slo}
	}
	for x, f := range from {
		f.a.pages[f.i], da.pages[dlo+x] = false, true
		off := int64(f.i) * page
		discardMem(f.a.mem[off : off+page])
	}
	return nil
}
