package native

import (
	"errors"
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/device"
)

// PageOps are a backend's calls behind one page of device.Mapper.
type PageOps interface {
	// MapPage creates the physical memory of one page and maps it at
	// addr, returning its handle. When it fails, nothing of it is left.
	MapPage(addr uintptr) (handle uintptr, err error)
	// Access gives the device read and write access to [addr, addr+size),
	// pages MapPage has just mapped (cuMemSetAccess; nothing on AscendCL).
	Access(addr uintptr, size int64) error
	// UnmapPage unmaps the page at addr and frees its memory.
	UnmapPage(addr, handle uintptr) error
}

// Reservations is the bookkeeping of a device.Mapper over a driver whose
// mappings are whole physical allocations (cuMemMap, aclrtMapMem): it
// records the reserved ranges and, for each page, the handle MapPage made.
// One physical allocation per page is what lets Unmap be asked for any run
// of pages, a part of one earlier Map or the union of several, as the
// allocator asks: the drivers unmap whole mappings only. The state is
// checked before any driver call, so a wrong range is an error wrapping
// device.ErrInvalidValue and leaves the driver alone.
//
// It is not safe for concurrent use: the backend serializes its calls.
type Reservations struct {
	Backend string // for errors: "cuda"
	Page    int64

	rs []reservation // by base address
}

type reservation struct {
	base    uintptr
	handles []uintptr
	mapped  []bool
}

func (r *Reservations) find(p uintptr) int {
	i, found := slices.BinarySearchFunc(r.rs, p, func(x reservation, p uintptr) int {
		switch {
		case x.base < p:
			return -1
		case x.base > p:
			return 1
		}
		return 0
	})
	if !found {
		i--
	}
	return i
}

// Add records the reservation of size bytes at base (whole pages).
func (r *Reservations) Add(base uintptr, size int64) {
	n := int(size / r.Page)
	i := r.find(base) + 1
	r.rs = slices.Insert(r.rs, i, reservation{base: base, handles: make([]uintptr, n), mapped: make([]bool, n)})
}

// span finds the pages [lo, hi) of [p, p+size) in one reservation.
func (r *Reservations) span(what string, p uintptr, size int64) (*reservation, int, int, error) {
	i := r.find(p)
	if i < 0 || size <= 0 || int64(p-r.rs[i].base)%r.Page != 0 || size%r.Page != 0 ||
		int64(p-r.rs[i].base)+size > int64(len(r.rs[i].handles))*r.Page {
		return nil, 0, 0, fmt.Errorf("%s: %s %#x+%d: not whole pages of a reservation: %w", r.Backend, what, p, size, device.ErrInvalidValue)
	}
	lo := int(int64(p-r.rs[i].base) / r.Page)
	return &r.rs[i], lo, lo + int(size/r.Page), nil
}

// Map maps every page of [p, p+size), none of which may be mapped, and
// gives the device access to them. On failure the pages it mapped are
// unmapped again: nothing is left behind.
func (r *Reservations) Map(ops PageOps, p uintptr, size int64) error {
	res, lo, hi, err := r.span("map", p, size)
	if err != nil {
		return err
	}
	for i := lo; i < hi; i++ {
		if res.mapped[i] {
			return fmt.Errorf("%s: map %#x+%d: page %d already mapped: %w", r.Backend, p, size, i, device.ErrInvalidValue)
		}
	}
	for i := lo; i < hi; i++ {
		h, err := ops.MapPage(res.base + uintptr(int64(i)*r.Page))
		if err != nil {
			return fmt.Errorf("%s: map %#x+%d: page %d of %d: %w", r.Backend, p, size, i-lo, hi-lo, errors.Join(err, r.undo(ops, res, lo, i)))
		}
		res.handles[i], res.mapped[i] = h, true
	}
	if err := ops.Access(p, size); err != nil {
		return fmt.Errorf("%s: map %#x+%d: %w", r.Backend, p, size, errors.Join(err, r.undo(ops, res, lo, hi)))
	}
	return nil
}

// undo unmaps the pages [lo, hi) a failed Map mapped.
func (r *Reservations) undo(ops PageOps, res *reservation, lo, hi int) error {
	var errs []error
	for i := lo; i < hi; i++ {
		if err := ops.UnmapPage(res.base+uintptr(int64(i)*r.Page), res.handles[i]); err != nil {
			errs = append(errs, err)
		}
		res.handles[i], res.mapped[i] = 0, false
	}
	return errors.Join(errs...)
}

// Unmap unmaps every page of [p, p+size), all of which must be mapped.
func (r *Reservations) Unmap(ops PageOps, p uintptr, size int64) error {
	res, lo, hi, err := r.span("unmap", p, size)
	if err != nil {
		return err
	}
	for i := lo; i < hi; i++ {
		if !res.mapped[i] {
			return fmt.Errorf("%s: unmap %#x+%d: page %d not mapped: %w", r.Backend, p, size, i, device.ErrInvalidValue)
		}
	}
	if err := r.undo(ops, res, lo, hi); err != nil {
		return fmt.Errorf("%s: unmap %#x+%d: %w", r.Backend, p, size, err)
	}
	return nil
}

// Release unmaps what is still mapped in the reservation at base and
// forgets it, returning its size for the driver call that frees the range
// (also when an unmap failed: the range goes back either way).
func (r *Reservations) Release(ops PageOps, base uintptr) (int64, error) {
	i := r.find(base)
	if i < 0 || r.rs[i].base != base {
		return 0, fmt.Errorf("%s: release address %#x: not a reservation: %w", r.Backend, base, device.ErrInvalidValue)
	}
	res := r.rs[i]
	var errs []error
	for j, m := range res.mapped {
		if m {
			if err := ops.UnmapPage(res.base+uintptr(int64(j)*r.Page), res.handles[j]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	r.rs = slices.Delete(r.rs, i, i+1)
	size := int64(len(res.handles)) * r.Page
	if err := errors.Join(errs...); err != nil {
		return size, fmt.Errorf("%s: release address %#x: %w", r.Backend, base, err)
	}
	return size, nil
}

// MappedPages counts the pages mapped over every reservation.
func (r *Reservations) MappedPages() int64 {
	var n int64
	for _, res := range r.rs {
		for _, m := range res.mapped {
			if m {
				n++
			}
		}
	}
	return n
}

// Len is the number of reservations.
func (r *Reservations) Len() int { return len(r.rs) }

// PageMover is PageOps for a driver whose physical allocations outlive
// their mappings (cuMemUnmap leaves the allocation, cuMemRelease frees
// it): a page's memory can be mapped elsewhere without being freed and
// made again.
type PageMover interface {
	PageOps
	// UnmapOnly unmaps the page at addr and keeps its memory (handle).
	UnmapOnly(addr, handle uintptr) error
	// MapHandle maps the memory of handle at addr.
	MapHandle(addr, handle uintptr) error
}

// Move moves the memory of the mapped pages at srcs (one page each) to
// the unmapped pages from dst on, in order, page by page, and gives the
// device access to them with one call. It is all or nothing: on a failure
// the pages moved so far go back where they were.
func (r *Reservations) Move(ops PageMover, dst uintptr, srcs []uintptr) error {
	n := len(srcs)
	if n == 0 {
		return nil
	}
	size := int64(n) * r.Page
	dres, dlo, _, err := r.span("move", dst, size)
	if err != nil {
		return err
	}
	type loc struct {
		res *reservation
		i   int
	}
	from := make([]loc, n)
	for x, src := range srcs {
		res, i, _, err := r.span("move", src, r.Page)
		if err != nil {
			return err
		}
		if !res.mapped[i] {
			return fmt.Errorf("%s: move %#x: page not mapped: %w", r.Backend, src, device.ErrInvalidValue)
		}
		if res == dres && i >= dlo && i < dlo+n {
			return fmt.Errorf("%s: move %#x into %#x+%d: the page is in the range: %w", r.Backend, src, dst, size, device.ErrInvalidValue)
		}
		from[x] = loc{res, i}
	}
	for i := range n {
		if dres.mapped[dlo+i] {
			return fmt.Errorf("%s: move to %#x+%d: page %d already mapped: %w", r.Backend, dst, size, dlo+i, device.ErrInvalidValue)
		}
	}
	at := func(res *reservation, i int) uintptr { return res.base + uintptr(int64(i)*r.Page) }
	back := func(moved int) error {
		var errs []error
		for x := range moved {
			h, f := dres.handles[dlo+x], from[x]
			errs = append(errs, ops.UnmapOnly(at(dres, dlo+x), h), ops.MapHandle(at(f.res, f.i), h), ops.Access(at(f.res, f.i), r.Page))
			dres.handles[dlo+x], dres.mapped[dlo+x] = 0, false
			f.res.handles[f.i], f.res.mapped[f.i] = h, true
		}
		return errors.Join(errs...)
	}
	for x, f := range from {
		h := f.res.handles[f.i]
		if err := ops.UnmapOnly(at(f.res, f.i), h); err != nil {
			return fmt.Errorf("%s: move to %#x+%d: page %d of %d: %w", r.Backend, dst, size, x, n, errors.Join(err, back(x)))
		}
		if err := ops.MapHandle(at(dres, dlo+x), h); err != nil {
			err = errors.Join(err, ops.MapHandle(at(f.res, f.i), h), ops.Access(at(f.res, f.i), r.Page))
			return fmt.Errorf("%s: move to %#x+%d: page %d of %d: %w", r.Backend, dst, size, x, n, errors.Join(err, back(x)))
		}
		f.res.handles[f.i], f.res.mapped[f.i] = 0, false
		dres.handles[dlo+x], dres.mapped[dlo+x] = h, true
	}
	if err := ops.Access(dst, size); err != nil {
		return fmt.Errorf("%s: move to %#x+%d: %w", r.Backend, dst, size, errors.Join(err, back(n)))
	}
	return nil
}
