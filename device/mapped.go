package device

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// Mapper is a Device that can reserve address space and back it with
// physical memory a page at a time: CUDA's virtual memory management
// (cuMemAddressReserve, cuMemCreate, cuMemMap), AscendCL's
// aclrtReserveMemAddress and aclrtMapMem, and the host backend, which models
// them. An Allocator set up on a Mapper (ReserveMapped) never needs a free
// range of physical memory as large as a request, only enough free pages:
// fragmentation costs it at most the unused part of partly used pages.
type Mapper interface {
	// PageSize is the granularity of Map and Unmap in bytes, a power of
	// two; 0 when the device cannot map (a driver without the API).
	PageSize() int64
	// ReserveAddress reserves size bytes of address space, a multiple of
	// PageSize, with no memory behind it.
	ReserveAddress(size int64) (DevPtr, error)
	// ReleaseAddress waits for the work queued on the device, unmaps what
	// is still mapped in the reservation at p and returns the range.
	ReleaseAddress(p DevPtr) error
	// Map backs the pages [p, p+size) of a reservation with new physical
	// memory that the device reads and writes. It fails with an error
	// wrapping ErrOutOfMemory when the device has no memory left.
	Map(p DevPtr, size int64) error
	// Unmap releases the physical memory behind the pages [p, p+size),
	// which Map mapped. No queued work may still use them: unlike cudaFree,
	// unmapping does not wait for the device.
	Unmap(p DevPtr, size int64) error
}

// Remapper is a Mapper that moves the memory behind mapped pages to other
// pages in one step, cheaper than Unmap and Map where the driver's
// physical allocations outlive their mappings: on CUDA it saves a
// cuMemRelease and a cuMemCreate per page, a third of what moving a page
// costs. The allocator moves the pages of cached ranges (mapped, used by
// no block, no queued work on them) to a block that needs pages.
type Remapper interface {
	// Remap unmaps the pages at srcs (one page each, mapped by Map, no
	// queued work on them) and maps their memory, in order, at the pages
	// from dst on, none of which is mapped, for the device to read and
	// write (one access call for the whole range). The bytes are not kept.
	// On failure nothing has moved.
	Remap(dst DevPtr, srcs []DevPtr) error
}

// PageSizer is a Mapper whose page size follows the memory it is to
// hold: SizePages, called by ReserveMapped before it reserves anything,
// lets the device choose its pages for a limit of limit bytes (CUDA: the
// driver's costs go by mapping, so larger pages move memory for less, while
// a small limit wants small pages, its waste in partly used pages being a
// larger share of it). A page size the host set stays.
type PageSizer interface {
	SizePages(limit int64)
}

// PageFor is the page size a PageSizer picks for a limit of limit bytes:
// the largest power of two at most limit/1024, from granule (the driver's
// smallest page) up to most. With 2 MiB and 16 MiB (CUDA) a limit of
// 16 GiB and more gets 16 MiB pages, one of 2 GiB and less 2 MiB ones.
func PageFor(limit, granule, most int64) int64 {
	page := granule
	for page*2 <= most && page*2*1024 <= limit {
		page *= 2
	}
	return page
}

// pageMap is the page state of one segment of reserved address space.
type pageMap struct {
	shift uint
	// users counts the used blocks that overlap each page: a page some
	// block uses is mapped; one no block uses may be (cached) or not.
	users  []int32
	mapped []bool
	// planned marks the pages a placement plan uses (nil: no plan): the
	// pages to keep mapped.
	planned []bool
	// uses lists, per page, when the plan's blocks on it begin their
	// lives (sorted; nil when the plan's pages fit the budget), so that
	// the page moved away is the one needed again last.
	uses [][]int32
	// prefix[i] is the number of mapped pages among the first i, so that a
	// range's unmapped pages cost two loads on the allocation path.
	prefix []int32
}

func newPageMap(size, page int64) *pageMap {
	n := int(size / page)
	return &pageMap{shift: uint(bits.TrailingZeros64(uint64(page))), users: make([]int32, n),
		mapped: make([]bool, n), prefix: make([]int32, n+1)}
}

// span is the range of pages [lo, hi) that size bytes at addr overlap.
func (pm *pageMap) span(seg *segment, addr uintptr, size int64) (lo, hi int) {
	off := int64(addr - seg.addr)
	return int(off >> pm.shift), int((off+size-1)>>pm.shift) + 1
}

func (pm *pageMap) unmapped(lo, hi int) int { return hi - lo - int(pm.prefix[hi]-pm.prefix[lo]) }

// unused counts the pages in [lo, hi) that no used block overlaps: what a
// block over them adds to the pages in use.
func (pm *pageMap) unused(lo, hi int) int {
	n := 0
	for _, u := range pm.users[lo:hi] {
		if u == 0 {
			n++
		}
	}
	return n
}

func (pm *pageMap) setMapped(lo, hi int, on bool) {
	for i := lo; i < hi; i++ {
		pm.mapped[i] = on
	}
	for i := lo; i < len(pm.mapped); i++ {
		pm.prefix[i+1] = pm.prefix[i]
		if pm.mapped[i] {
			pm.prefix[i+1]++
		}
	}
}

// usePages counts b in or out of the users of its pages.
func (a *arena) usePages(seg *segment, b *block, delta int32) {
	pm := seg.pages
	lo, hi := pm.span(seg, b.addr, b.size)
	for i := lo; i < hi; i++ {
		if pm.users[i] == 0 {
			a.usedPages++
		}
		pm.users[i] += delta
		if pm.users[i] == 0 {
			a.usedPages--
		}
	}
}

// pickMapped chooses the free block to serve size bytes from in a mapped
// arena, or -1 when none fits in the page budget: it fails exactly when
// minExtra says the request does not fit, which is what EvictionWindow
// goes by. Among the best fits, the first that is ready and whose pages
// are all mapped wins (the hot path: no device call); failing that, the
// candidate with the fewest pages to map (each a driver call of tens of
// microseconds, against a stream wait for a block not ready yet), then the
// one that adds the fewest pages in use, then the one freed longest ago.
// The search goes past the first candidates while every one seen needs
// pages mapped: a mapped fit anywhere in the list beats remapping.
func (a *arena) pickMapped(size int64, ready func(*block) bool) (int, int64) {
	i := a.firstFit(size)
	n := len(a.free)
	best, bestExtra, bestUnmapped, bestOff := -1, 0, 0, int64(0)
	for j := i; j < n; j++ {
		if j >= i+oldestCandidates && j != n-1 && best >= 0 && bestUnmapped == 0 {
			// Enough candidates seen: the largest block (fresh address
			// space, if any) is the last worth asking.
			j = n - 1
		}
		b := a.free[j]
		seg := &a.segs[b.seg]
		lo, hi := seg.pages.span(seg, b.addr, size)
		um := seg.pages.unmapped(lo, hi)
		if um == 0 && j < i+preferCandidates && (ready == nil || ready(b)) {
			return j, 0
		}
		var off int64
		if um > 0 {
			// A run of mapped pages further into the block serves the
			// request with no driver call: the block's head stays free.
			if o, ok := a.mappedWindow(seg, b, size); ok {
				off, um = o, 0
				lo, hi = seg.pages.span(seg, b.addr+uintptr(off), size)
			}
		}
		if best >= 0 && um > bestUnmapped {
			continue
		}
		extra := seg.pages.unused(lo, hi)
		if a.usedPages+int64(extra) > a.budget {
			continue
		}
		if best < 0 || um < bestUnmapped || (um == bestUnmapped && (extra < bestExtra ||
			(extra == bestExtra && b.freed < a.free[best].freed))) {
			best, bestExtra, bestUnmapped, bestOff = j, extra, um, off
		}
	}
	return best, bestOff
}

// mappedWindow finds, inside the free block b, the first page-aligned
// offset from which size bytes lie on mapped pages only.
func (a *arena) mappedWindow(seg *segment, b *block, size int64) (int64, bool) {
	pm := seg.pages
	page := int64(1) << pm.shift
	first := (int64(b.addr-seg.addr) + page - 1) / page // first page starting inside b
	last := (int64(b.addr-seg.addr) + b.size - size) / page
	need := int((size + page - 1) / page)
	if int(last) < int(first) || pm.unmapped(int(first), int(last)+need) == int(last)+need-int(first) {
		return 0, false // no mapped page in the block: fresh address space
	}
	for p := int(first); p <= int(last); p++ {
		if pm.unmapped(p, p+need) == 0 {
			return int64(seg.addr) + int64(p)*page - int64(b.addr), true
		}
	}
	return 0, false
}

// offPlanCandidates bounds the free blocks pickOffPlan looks at.
const offPlanCandidates = 64

// pickOffPlan finds, among the best-fitting free blocks, room for size
// bytes on pages that are mapped and that no placement plan uses: the free
// block's index and the offset in it, or -1.
func (a *arena) pickOffPlan(size int64) (int, int64) {
	i := a.firstFit(size)
	for j := i; j < len(a.free) && j < i+offPlanCandidates; j++ {
		b := a.free[j]
		seg := &a.segs[b.seg]
		pm := seg.pages
		if pm == nil || pm.planned == nil {
			continue
		}
		lo, hi := pm.span(seg, b.addr, b.size)
		if pm.unmapped(lo, hi) == hi-lo {
			continue
		}
		page := int64(1) << pm.shift
		// Starts to try: the block's own, then each page boundary in it.
		for start := int64(b.addr - seg.addr); start+size <= int64(b.addr-seg.addr)+b.size; {
			plo, phi := int(start>>pm.shift), int((start+size-1)>>pm.shift)+1
			bad := -1
			for k := plo; k < phi; k++ {
				if !pm.mapped[k] || pm.planned[k] {
					bad = k
				}
			}
			if bad < 0 {
				return j, start - int64(b.addr-seg.addr)
			}
			start = int64(bad+1) * page
		}
	}
	return -1, 0
}

// minExtra is the fewest pages a request of size bytes adds to the pages in
// use, over every free range it fits in; a request that fits in none takes
// fresh address space.
func (a *arena) minExtra(size int64) int64 {
	best := (size + int64(1)<<a.segs[0].pages.shift - 1) >> a.segs[0].pages.shift
	for _, b := range a.free[a.firstFit(size):] {
		seg := &a.segs[b.seg]
		lo, hi := seg.pages.span(seg, b.addr, size)
		best = min(best, int64(seg.pages.unused(lo, hi)))
	}
	return best
}

// ReserveMapped sets the allocator up on address space instead of
// segments of memory: it reserves address space from the device, which must
// be a Mapper, and maps pages behind blocks as they are handed out, never
// holding more than limit bytes of pages (rounded down to whole pages).
// The budget is mapped at once; freed pages stay mapped for reuse and are
// unmapped (to be mapped where a request needs them) only when a request
// needs pages that the budget has no room for; a free range whose memory is
// still guarded by events is unmapped only after the host waits for them,
// so that path blocks the host (the allocator prefers ranges it can unmap
// at once). When no free range of address space fits a request, more is
// reserved.
//
// A request needs enough free pages, not one free range of physical
// memory: small blocks share pages, and a large block takes pages wherever
// they are. It fails with an error wrapping ErrNotSupported when the device
// cannot map or limit is under one page, and must be the allocator's only
// Reserve call.
func (a *Allocator) ReserveMapped(limit int64) error {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	p := &a.p
	if p.closed {
		return fmt.Errorf("allocator: reserve mapped %d bytes: %w", limit, ErrClosed)
	}
	m, ok := p.dev.(Mapper)
	if !ok {
		return fmt.Errorf("allocator: reserve mapped: %s cannot map pages: %w", p.dev.Name(), ErrNotSupported)
	}
	if ps, ok := m.(PageSizer); ok && len(p.a.segs) == 0 {
		ps.SizePages(limit)
	}
	page := m.PageSize()
	switch {
	case page <= 0:
		return fmt.Errorf("allocator: reserve mapped: %s cannot map pages: %w", p.dev.Name(), ErrNotSupported)
	case page&(page-1) != 0 || page%p.a.align != 0:
		return fmt.Errorf("allocator: reserve mapped: page size %d: %w", page, ErrInvalidValue)
	case limit < page:
		return fmt.Errorf("allocator: reserve mapped %d bytes: under one page of %d: %w", limit, page, ErrNotSupported)
	case len(p.a.segs) > 0:
		return fmt.Errorf("allocator: reserve mapped: segments already reserved: %w", ErrInvalidValue)
	}
	p.mapper, p.page = m, page
	p.a.budget = limit / page
	// Twice the limit: every block could be placed anew while as much
	// again is held, so address space runs out only in contrived cases,
	// and then more is reserved.
	p.space = 2 * p.a.budget * page
	p.alloc = func(size int64) (uintptr, error) {
		ptr, err := m.ReserveAddress(size)
		return uintptr(ptr), err
	}
	p.free = a.releaseMapped
	if err := p.growMapped(p.space); err != nil {
		return err
	}
	// The whole budget is mapped up front, as Reserve would allocate it:
	// a limit the device cannot hold fails here, not in the middle of a
	// step, and until fragmentation asks for pages elsewhere the device
	// is never called again.
	seg := &p.a.segs[0]
	p.maps++
	if err := m.Map(DevPtr(seg.addr), p.a.budget*page); err != nil {
		return fmt.Errorf("allocator: reserve mapped %d bytes: %w", limit, err)
	}
	seg.pages.setMapped(0, int(p.a.budget), true)
	p.a.mappedPages = p.a.budget
	return nil
}

// growMapped reserves size bytes (rounded up to pages) of address space.
func (p *pool) growMapped(size int64) error {
	size = (size + p.page - 1) / p.page * p.page
	if err := p.grow(size); err != nil {
		return err
	}
	seg := &p.a.segs[len(p.a.segs)-1]
	seg.pages = newPageMap(size, p.page)
	return nil
}

// releaseMapped returns every reservation; the Mapper waits for the device.
func (a *Allocator) releaseMapped() error {
	var errs []error
	for _, s := range a.p.a.segs {
		if err := a.p.mapper.ReleaseAddress(DevPtr(s.addr)); err != nil {
			errs = append(errs, err)
		}
	}
	a.p.a.mappedPages = 0
	return errors.Join(errs...)
}

// takeMapped is get's choice on a mapped allocator: a block whose pages are
// mapped (mapping them, and unmapping cached pages to make room, if need
// be). Called with p.mu held.
func (p *pool) takeMapped(need int64, ready func(*block) bool) (*block, error) {
	if p.pl.placing || p.pl.following {
		// A block with no place of its own stays off the pages planned
		// blocks use, where it would push one of them out of its place.
		if i, off := p.a.pickOffPlan(need); i >= 0 {
			return p.a.takeFrom(i, off, need), nil
		}
	}
	i, off := p.a.pickMapped(need, ready)
	if i < 0 && p.a.firstFit(need) == len(p.a.free) {
		// No free range of address space fits: reserve more.
		if err := p.growMapped(max(need, p.space)); err != nil {
			return nil, err
		}
		i, off = p.a.pickMapped(need, ready)
	}
	if i < 0 {
		return nil, nil
	}
	b := p.a.takeFrom(i, off, need)
	if err := p.back(b); err != nil {
		p.a.give(b.addr, pend{}, false)
		return nil, err
	}
	return b, nil
}

// back maps the pages of the used block b that are not mapped yet.
func (p *pool) back(b *block) error {
	seg := &p.a.segs[b.seg]
	pm := seg.pages
	lo, hi := pm.span(seg, b.addr, b.size)
	um := pm.unmapped(lo, hi)
	if um == 0 {
		return nil
	}
	if over := p.a.mappedPages + int64(um) - p.a.budget; over > 0 {
		if rm, ok := p.mapper.(Remapper); ok {
			// The cached pages' memory moves here instead of being
			// freed and made again.
			if err := p.remap(rm, seg, lo, hi, over); err != nil {
				return err
			}
		} else if err := p.reclaim(over); err != nil {
			return err
		}
	}
	for i := lo; i < hi; {
		if pm.mapped[i] {
			i++
			continue
		}
		j := i
		for j < hi && !pm.mapped[j] {
			j++
		}
		p.maps++
		if err := p.mapper.Map(DevPtr(seg.addr+uintptr(i)<<pm.shift), int64(j-i)<<pm.shift); err != nil {
			return fmt.Errorf("%s: map %d pages: %w", p.what, j-i, err)
		}
		pm.setMapped(i, j, true)
		p.a.mappedPages += int64(j - i)
		p.pagesIn += int64(j - i)
		i = j
	}
	return nil
}

// reclaim unmaps n cached pages (mapped, used by no block). Free ranges
// whose events have completed go first; then the host waits for the events
// of others.
func (p *pool) reclaim(n int64) error {
	return p.cachedPages(n, func(seg *segment, lo, hi int) error {
		pm := seg.pages
		p.unmaps++
		if err := p.mapper.Unmap(DevPtr(seg.addr+uintptr(lo)<<pm.shift), int64(hi-lo)<<pm.shift); err != nil {
			return fmt.Errorf("%s: unmap %d pages: %w", p.what, hi-lo, err)
		}
		pm.setMapped(lo, hi, false)
		p.a.mappedPages -= int64(hi - lo)
		p.pagesOut += int64(hi - lo)
		return nil
	})
}

// cachedPages hands take n cached pages (mapped, used by no block), a run
// [lo, hi) of seg's pages at a time, from free ranges settled first: ranges
// whose events have completed go first; then the host waits for the events
// of others. take leaves the run unmapped in the page map.
func (p *pool) cachedPages(n int64, take func(seg *segment, lo, hi int) error) error {
	// Pass 0 takes the pages no placement plan uses; passes 1 and 2 any,
	// pass 2 waiting for events.
	for pass := 0; pass < 3 && n > 0; pass++ {
		if pass == 1 && p.pl.placing && p.a.segs[0].pages.uses != nil {
			var err error
			if n, err = p.farthestPages(n, take); err != nil {
				return err
			}
			continue
		}
		err := p.settledCached(pass == 2, func(seg *segment, lo, hi int) (bool, error) {
			pm := seg.pages
			for i := lo; i < hi && n > 0; {
				keep := func(k int) bool { return pass == 0 && pm.planned != nil && pm.planned[k] }
				if pm.users[i] != 0 || !pm.mapped[i] || keep(i) {
					i++
					continue
				}
				j := i
				for j < hi && int64(j-i) < n && pm.users[j] == 0 && pm.mapped[j] && !keep(j) {
					j++
				}
				if err := take(seg, i, j); err != nil {
					return false, err
				}
				n -= int64(j - i)
				i = j
			}
			return n > 0, nil
		})
		if err != nil {
			return err
		}
	}
	if n > 0 {
		return fmt.Errorf("%s: %d pages short: %w", p.what, n, ErrOutOfMemory)
	}
	return nil
}

// settledCached calls visit with the pages [lo, hi) of each free range
// that holds cached pages and whose events have completed (the host
// waiting for them when wait), until visit returns false.
func (p *pool) settledCached(wait bool, visit func(seg *segment, lo, hi int) (bool, error)) error {
	for si := range p.a.segs {
		seg := &p.a.segs[si]
		pm := seg.pages
		for f := seg.head; f != nil; f = f.next {
			if !f.free {
				continue
			}
			lo, hi := pm.span(seg, f.addr, f.size)
			if !pm.cached(lo, hi) {
				continue
			}
			if len(f.pending) > 0 {
				ok, err := p.settle(f, wait)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
			}
			more, err := visit(seg, lo, hi)
			if err != nil || !more {
				return err
			}
		}
	}
	return nil
}

// farthestPages hands take up to n cached pages of settled free ranges,
// those the placement plan needs again last first (Belady's choice), and
// returns how many are still wanted.
func (p *pool) farthestPages(n int64, take func(seg *segment, lo, hi int) error) (int64, error) {
	type cand struct {
		seg  *segment
		page int
		next int64
	}
	var cs []cand
	now := int32(p.pl.clock)
	err := p.settledCached(false, func(seg *segment, lo, hi int) (bool, error) {
		pm := seg.pages
		for k := lo; k < hi; k++ {
			if pm.users[k] != 0 || !pm.mapped[k] {
				continue
			}
			next := int64(1) << 40 // the plan does not use it
			if k < len(pm.uses) && len(pm.uses[k]) > 0 {
				u := pm.uses[k]
				if i, _ := slices.BinarySearch(u, now+1); i < len(u) {
					next = int64(u[i])
				} else {
					next = int64(u[0]) + 1<<31 // in the next repetition
				}
			}
			cs = append(cs, cand{seg, k, next})
		}
		return true, nil
	})
	if err != nil {
		return n, err
	}
	slices.SortFunc(cs, func(x, y cand) int { return cmp.Compare(y.next, x.next) })
	for _, c := range cs {
		if n == 0 {
			break
		}
		if err := take(c.seg, c.page, c.page+1); err != nil {
			return n, err
		}
		n--
	}
	return n, nil
}

// remap moves the memory of n cached pages to the unmapped pages of
// [lo, hi) of dseg, lowest first (Remapper), one call per run of unmapped
// pages; the caller maps the rest. The pages are chosen as reclaim
// chooses them and leave the page map at once, so that none is chosen
// twice; a failed move puts back those it did not move.
func (p *pool) remap(rm Remapper, dseg *segment, lo, hi int, n int64) error {
	type run struct {
		seg    *segment
		lo, hi int
	}
	var runs []run
	err := p.cachedPages(n, func(seg *segment, slo, shi int) error {
		seg.pages.setMapped(slo, shi, false)
		runs = append(runs, run{seg, slo, shi})
		return nil
	})
	srcs := p.srcs[:0]
	for _, r := range runs {
		for i := r.lo; i < r.hi; i++ {
			srcs = append(srcs, DevPtr(r.seg.addr+uintptr(i)<<r.seg.pages.shift))
		}
	}
	p.srcs = srcs
	// restore maps back, in the page map, the sources from srcs[from] on.
	restore := func(from int) {
		x := 0
		for _, r := range runs {
			if l := r.lo + max(from-x, 0); l < r.hi {
				r.seg.pages.setMapped(l, r.hi, true)
			}
			x += r.hi - r.lo
		}
	}
	if err != nil {
		restore(0)
		return err
	}
	dpm := dseg.pages
	used := 0
	for i := lo; i < hi && used < len(srcs); {
		if dpm.mapped[i] {
			i++
			continue
		}
		j := i
		for j < hi && !dpm.mapped[j] && used+(j-i) < len(srcs) {
			j++
		}
		k := j - i
		p.maps++
		p.unmaps++
		if err := rm.Remap(DevPtr(dseg.addr+uintptr(i)<<dpm.shift), srcs[used:used+k]); err != nil {
			restore(used)
			return fmt.Errorf("%s: move %d pages: %w", p.what, k, err)
		}
		dpm.setMapped(i, j, true)
		p.pagesIn += int64(k)
		p.pagesOut += int64(k)
		used += k
		i = j
	}
	return nil
}

// cached reports whether a page in [lo, hi) is mapped with no user.
func (pm *pageMap) cached(lo, hi int) bool {
	for i := lo; i < hi; i++ {
		if pm.users[i] == 0 && pm.mapped[i] {
			return true
		}
	}
	return false
}

// settle makes sure the work behind the free block f's events is done, so
// that its pages may be unmapped: without wait it only asks the device;
// with wait it blocks the host until each event completes. It reports
// whether f is settled, and drops its events then.
func (p *pool) settle(f *block, wait bool) (bool, error) {
	for _, e := range f.pending {
		done, err := p.dev.Query(e.ev)
		if err != nil {
			return false, fmt.Errorf("%s: reclaim: %w", p.what, err)
		}
		if done {
			continue
		}
		if !wait {
			return false, nil
		}
		p.syncs++
		if err := p.dev.SyncEvent(e.ev); err != nil {
			return false, fmt.Errorf("%s: reclaim: %w", p.what, err)
		}
	}
	p.a.release(f)
	return true, nil
}
