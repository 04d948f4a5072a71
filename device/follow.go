package device

import (
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/plan/place"
)

// Follow hands the allocator a layout the caller planned (plan.Layout):
// blocks at offsets from the start of its memory (the first range Reserve
// or ReserveMapped took), with their lives. Until Follow(nil), AllocAt
// serves a request at its offset where that range is free, the pages the
// layout uses are the last the allocator unmaps or moves, a request with no
// offset goes on other mapped pages where it can, and the allocator plans
// no placement of its own (Repeat records nothing): the caller's layout is
// the plan. Lives are not used beyond which pages the layout touches.
func (a *Allocator) Follow(blocks []place.Placed) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	p := &a.p
	pl := &p.pl
	pl.placing, pl.plan, pl.planKey, pl.deferred = false, pl.plan[:0], nil, false
	p.unplan()
	pl.following = len(blocks) > 0 && len(p.a.segs) > 0
	if !pl.following {
		return
	}
	pl.on, pl.recs, pl.carried, pl.prevKeys = false, pl.recs[:0], pl.carried[:0], pl.prevKeys[:0]
	pl.plans++
	p.a.index()
	seg := &p.a.segs[0]
	pm := seg.pages
	if pm == nil {
		return
	}
	pm.planned = make([]bool, len(pm.mapped))
	for _, b := range blocks {
		if b.Size <= 0 || int64(b.Addr)+b.Size > seg.size {
			continue
		}
		lo, hi := pm.span(seg, seg.addr+b.Addr, b.Size)
		for k := lo; k < hi; k++ {
			pm.planned[k] = true
		}
	}
}

// AllocAt is Alloc of a block at offset off from the start of the
// allocator's memory (Follow): served there when that range is free and,
// on mapped pages, its pages fit in the budget (Stats.Placed), and as Alloc
// serves it otherwise (Stats.Missed). A negative off is Alloc. The block is
// served like any other, behind the events of the memory it reuses.
func (a *Allocator) AllocAt(size int64, s Stream, off int64) (DevPtr, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	p := &a.p
	var at uintptr
	if off >= 0 && len(p.a.segs) > 0 && off < p.a.segs[0].size {
		at = p.a.segs[0].addr + uintptr(off)
	}
	b, err := p.getAt(size, s, at, false, false)
	if err != nil {
		return 0, err
	}
	return DevPtr(b.addr), nil
}

// Place is AllocAt that serves the block at off or not at all: an error
// wrapping ErrOutOfMemory when that range is not free (or off is outside
// the first range). It moves a tensor to its place in a layout.
func (a *Allocator) Place(size int64, s Stream, off int64) (DevPtr, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	p := &a.p
	if off < 0 || len(p.a.segs) == 0 || off >= p.a.segs[0].size {
		return 0, fmt.Errorf("%s: place %d bytes at offset %d: outside the memory: %w", p.what, size, off, ErrOutOfMemory)
	}
	b, err := p.getAt(size, s, p.a.segs[0].addr+uintptr(off), true, false)
	if err != nil {
		return 0, err
	}
	return DevPtr(b.addr), nil
}

// Offset is ptr's offset from the start of the allocator's memory, and
// whether ptr lies in its first range (where Follow's offsets point).
func (a *Allocator) Offset(ptr DevPtr) (int64, bool) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	if len(a.p.a.segs) == 0 {
		return 0, false
	}
	seg := &a.p.a.segs[0]
	if uintptr(ptr) < seg.addr || uintptr(ptr) >= seg.addr+uintptr(seg.size) {
		return 0, false
	}
	return int64(uintptr(ptr) - seg.addr), true
}

// takeOffset serves need bytes at addr for getAt, counting the placement
// unless strict (Place: there or not at all).
func (p *pool) takeOffset(addr uintptr, need int64, strict bool) (*block, error) {
	b, err := p.takePlanned(addr, need)
	if err != nil {
		return nil, fmt.Errorf("%s: alloc %d bytes at offset %d: %w", p.what, need, addr-p.a.segs[0].addr, err)
	}
	if strict {
		if b == nil {
			return nil, fmt.Errorf("%s: place %d bytes at offset %d: not free: %w", p.what, need, addr-p.a.segs[0].addr, ErrOutOfMemory)
		}
		return b, nil
	}
	if b != nil {
		p.pl.placed++
	} else {
		p.pl.missed++
	}
	return b, nil
}

// AllocAside is Alloc off the pages the layout it follows uses (Follow),
// mapping pages for it where none are free, so that a block moved out of
// the way of the layout's places takes none of them. Without a layout on
// mapped pages it is Alloc.
func (a *Allocator) AllocAside(size int64, s Stream) (DevPtr, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	b, err := a.p.getAt(size, s, 0, false, true)
	if err != nil {
		return 0, err
	}
	return DevPtr(b.addr), nil
}

// takeAside serves need bytes, for a pool that follows a layout on mapped
// pages, on pages the layout does not use, from the top of the address
// space down (the layout packs from the bottom), mapping pages as need be:
// a block the layout did not foresee, or one whose place was taken, then
// takes no other block's place. nil when no such room is left in the
// budget.
func (p *pool) takeAside(need int64) (*block, error) {
	if !p.pl.following || p.mapper == nil || len(p.a.segs) == 0 || p.a.segs[0].pages.planned == nil {
		return nil, nil
	}
	seg := &p.a.segs[0]
	pm := seg.pages
	page := int64(1) << pm.shift
	for j := len(p.a.byAddr) - 1; j >= 0; j-- {
		b := p.a.byAddr[j]
		if b.seg != 0 || b.size < need {
			continue
		}
		lo := int64(b.addr - seg.addr)
		// Page-aligned starts, the highest first, then the block's own.
		for start := (lo + b.size - need) / page * page; ; start -= page {
			if start < lo {
				start = lo
			}
			plo, phi := int(start>>pm.shift), int((start+need-1)>>pm.shift)+1
			clear := true
			for k := plo; k < phi && clear; k++ {
				clear = !pm.planned[k]
			}
			if clear && p.a.usedPages+int64(pm.unused(plo, phi)) <= p.a.budget {
				i, _ := slices.BinarySearchFunc(p.a.free, b, func(x, t *block) int { return freeCmp(x, t.size, t.addr) })
				nb := p.a.takeFrom(i, start-lo, need)
				if err := p.back(nb); err != nil {
					p.a.give(nb.addr, pend{}, false)
					return nil, err
				}
				return nb, nil
			}
			if start == lo {
				break
			}
		}
	}
	return nil, nil
}
