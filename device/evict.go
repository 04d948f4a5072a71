package device

import (
	"cmp"
	"fmt"
	"slices"
)

// Resident is an allocated block as its owner sees it, for
// Allocator.EvictionWindow.
type Resident struct {
	// Ptr is the block's address, as Alloc returned it.
	Ptr DevPtr
	// Movable says whether the owner may evict the block now.
	Movable bool
	// Cost is what evicting the block costs (the bytes to copy out).
	Cost int64
	// Age is when the block was last used, in any increasing unit: among
	// windows of equal cost the one whose newest block is oldest wins.
	Age uint64
}

// EvictionWindow chooses which allocated blocks to evict so that a request
// of size bytes fits: the cheapest run of adjacent blocks inside one segment,
// all of them movable or free, whose sizes (rounded, free neighbours
// included) add up to the rounded request. It appends to dst the indices into
// blocks of the blocks to evict, in address order, and reports whether such a
// run exists. An empty result with true means a free block fits already.
//
// Only the allocator knows its segments, free blocks and rounding, which is
// why the choice is made here: enough free bytes are not enough, the request
// needs one free range, and a range never spans two segments. An allocated
// block missing from blocks counts as unmovable; an entry whose Ptr is not an
// allocated block is ignored.
//
// On a mapped allocator (ReserveMapped) the request needs pages, not a free
// range: the run is the cheapest one whose eviction leaves no block on
// enough pages for the request to fit in the page budget (pages shared with
// blocks outside the run stay in use). When no run frees enough, movable
// blocks are taken least recently used first, wherever they are, until the
// pages they free are enough.
func (a *Allocator) EvictionWindow(size int64, blocks []Resident, dst []int) ([]int, bool, error) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	if a.p.closed {
		return dst, false, fmt.Errorf("allocator: eviction window for %d bytes: %w", size, ErrClosed)
	}
	if size <= 0 {
		return dst, false, fmt.Errorf("allocator: eviction window for %d bytes: %w", size, ErrInvalidValue)
	}
	dst, ok := a.p.a.window(a.p.a.roundUp(size), blocks, dst)
	return dst, ok, nil
}

// window is EvictionWindow over the arena; need is rounded.
func (a *arena) window(need int64, blocks []Resident, dst []int) ([]int, bool) {
	for i, r := range blocks {
		if b := a.used[uintptr(r.Ptr)]; b != nil {
			b.cand = int32(i + 1)
		}
	}
	defer func() {
		for _, r := range blocks {
			if b := a.used[uintptr(r.Ptr)]; b != nil {
				b.cand = 0
			}
		}
	}()
	movable := func(b *block) bool { return b.free || (b.cand > 0 && blocks[b.cand-1].Movable) }
	if a.budget > 0 {
		return a.windowPages(need, blocks, dst, movable)
	}
	// A run that starts right after a free block is beaten by the one that
	// starts at that block: same cost, more bytes.
	first, last := a.cheapestRun(blocks, movable,
		func(f *block) bool { return f.prev != nil && f.prev.free },
		func(_ int, _, _ *block, got int64) bool { return got >= need })
	if first == nil {
		return dst, false
	}
	return appendRun(dst, first, last), true
}

// cheapestRun finds, over every segment, the run of adjacent movable or
// free blocks that is enough (given the segment, the run's ends and the
// bytes it spans) at the least cost to evict, the least recently used among
// equals. skip rules out starts that another start beats. It returns nil
// when no run is enough.
func (a *arena) cheapestRun(blocks []Resident, movable, skip func(*block) bool,
	enough func(s int, first, last *block, got int64) bool) (*block, *block) {
	var bestFirst, bestLast *block
	var bestCost int64
	var bestAge uint64
	for s := range a.segs {
		for first := a.segs[s].head; first != nil; first = first.next {
			if !movable(first) || skip(first) {
				continue
			}
			var got, cost int64
			var age uint64
			for b := first; b != nil && movable(b); b = b.next {
				if !b.free {
					r := blocks[b.cand-1]
					cost += r.Cost
					age = max(age, r.Age)
				}
				if bestFirst != nil && cost > bestCost {
					break
				}
				if got += b.size; enough(s, first, b, got) {
					if bestFirst == nil || cost < bestCost || (cost == bestCost && age < bestAge) {
						bestFirst, bestLast, bestCost, bestAge = first, b, cost, age
					}
					break
				}
			}
		}
	}
	return bestFirst, bestLast
}

// appendRun appends the blocks of first..last that are in use (their index
// into the caller's blocks), in address order.
func appendRun(dst []int, first, last *block) []int {
	for b := first; ; b = b.next {
		if !b.free {
			dst = append(dst, int(b.cand-1))
		}
		if b == last {
			return dst
		}
	}
}

// windowPages is window on a mapped arena.
func (a *arena) windowPages(need int64, blocks []Resident, dst []int, movable func(*block) bool) ([]int, bool) {
	deficit := a.usedPages + a.minExtra(need) - a.budget
	if deficit <= 0 {
		return dst, true
	}
	// used[s][i]: pages in use among the first i of segment s.
	used := make([][]int32, len(a.segs))
	for s := range a.segs {
		pm := a.segs[s].pages
		u := make([]int32, len(pm.users)+1)
		for i, n := range pm.users {
			u[i+1] = u[i]
			if n > 0 {
				u[i+1]++
			}
		}
		used[s] = u
	}
	// freed is the pages that evicting the run first..last leaves unused:
	// those in use in its range but for a page it shares with a used block
	// outside it.
	freed := func(seg *segment, u []int32, first, last *block) int64 {
		pm := seg.pages
		lo, hi := pm.span(seg, first.addr, int64(last.addr+uintptr(last.size)-first.addr))
		n := int64(u[hi] - u[lo])
		startShared := false
		if p := first.prev; p != nil && !p.free {
			if _, phi := pm.span(seg, p.addr, p.size); phi-1 == lo {
				startShared = true
				n--
			}
		}
		if x := last.next; x != nil && !x.free {
			if xlo, _ := pm.span(seg, x.addr, x.size); xlo == hi-1 && !(startShared && hi-1 == lo) {
				n--
			}
		}
		return n
	}
	// A run that starts free frees no more than one that starts after.
	first, last := a.cheapestRun(blocks, movable, func(f *block) bool { return f.free },
		func(s int, first, last *block, _ int64) bool {
			return freed(&a.segs[s], used[s], first, last) >= deficit
		})
	if first != nil {
		return appendRun(dst, first, last), true
	}
	return a.lruPages(deficit, blocks, dst)
}

// lruPages takes movable blocks least recently used first until evicting
// them frees deficit pages.
func (a *arena) lruPages(deficit int64, blocks []Resident, dst []int) ([]int, bool) {
	order := make([]int, 0, len(blocks))
	for i, r := range blocks {
		if b := a.used[uintptr(r.Ptr)]; b != nil && r.Movable {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(blocks[x].Age, blocks[y].Age) })
	users := make([][]int32, len(a.segs))
	for s := range a.segs {
		users[s] = slices.Clone(a.segs[s].pages.users)
	}
	start := len(dst)
	var got int64
	for _, i := range order {
		b := a.used[uintptr(blocks[i].Ptr)]
		seg := &a.segs[b.seg]
		lo, hi := seg.pages.span(seg, b.addr, b.size)
		for p := lo; p < hi; p++ {
			if users[b.seg][p]--; users[b.seg][p] == 0 {
				got++
			}
		}
		dst = append(dst, i)
		if got >= deficit {
			slices.SortFunc(dst[start:], func(x, y int) int { return cmp.Compare(blocks[x].Ptr, blocks[y].Ptr) })
			return dst, true
		}
	}
	return dst[:start], false
}
