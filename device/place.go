package device

import (
	"cmp"
	"math/bits"
	"slices"
)

// Planned placement. A training step under one policy asks the allocator
// for the same blocks in the same order every iteration. Best fit, served
// online, scatters them: on a mapped allocator a step's largest blocks then
// find no run of mapped pages and the allocator moves pages for them every
// iteration (tens of microseconds of driver calls a page on CUDA), and on
// segments of memory a free range can be too split for a large block. Once
// a repetition of the sequence has been seen, the allocator knows each
// block's size and life, and packs them offline (greedy by size: the
// largest block first, each into the smallest gap of address space that is
// free for the whole of its life), so that the blocks of later repetitions
// land where their lives fit side by side in the fewest pages. A
// repetition asks for each block at its planned address; a block whose
// planned range is not free (the sequence changed, or lives moved) is
// served as before.

// span is a half-open interval [from, to) of a repetition's clock: the
// allocator's requests and frees, counted.
type span struct{ from, to int32 }

// life is when a block is in use in one repetition: one interval, or two
// for a block that lives across the end of one repetition into the next
// (its tail [from, end) and its head [0, to) of the next).
type life struct {
	n  int
	iv [2]span
}

func (l life) meets(m life) bool {
	if l.n == 1 && m.n == 1 {
		return l.iv[0].from < m.iv[0].to && m.iv[0].from < l.iv[0].to
	}
	return l.meetsAny(m)
}

func (l life) meetsAny(m life) bool {
	for _, x := range l.iv[:l.n] {
		for _, y := range m.iv[:m.n] {
			if x.from < y.to && y.from < x.to {
				return true
			}
		}
	}
	return false
}

// hull is the smallest span that holds the life.
func (l life) hull() (int32, int32) {
	lo, hi := l.iv[0].from, l.iv[0].to
	if l.n > 1 {
		lo, hi = min(lo, l.iv[1].from), max(hi, l.iv[1].to)
	}
	return lo, hi
}

// placedSet is placed blocks by address, a column each, so that the scan
// for the blocks a life meets reads the hulls alone.
type placedSet struct {
	addr, end []uintptr
	lo, hi    []int32 // the life's hull
	life      []life
}

func (s *placedSet) insert(k int, p placed) {
	lo, hi := p.life.hull()
	s.addr = slices.Insert(s.addr, k, p.addr)
	s.end = slices.Insert(s.end, k, p.addr+uintptr(p.size))
	s.lo = slices.Insert(s.lo, k, lo)
	s.hi = slices.Insert(s.hi, k, hi)
	s.life = slices.Insert(s.life, k, p.life)
}

// placed is a block at a fixed address with its life.
type placed struct {
	addr uintptr
	size int64
	life life
}

// placeItem is a block to place: its size and life.
type placeItem struct {
	size int64
	life life
}

// packBlocks places items in the address ranges segs (address, size), never
// overlapping a block of fixed or one another while their lives meet. It
// returns, per item, its address (items index the result), 0 where no
// range has room for it. Items go largest first (ties: earliest first),
// each into the smallest gap free for its whole life, the lowest such gap
// among equals. With page > 0 the ranges are mapped a page at a time and
// the fewest pages is what counts first: a block goes where it adds the
// fewest pages to those some block of fixed or items uses at some point
// (at either end of its gap), so that the pages the whole repetition uses
// can stay mapped.
func packBlocks(segs []placed, fixed []placed, items []placeItem, page int64) []uintptr {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	bySize := func(x, y int) int {
		if c := cmp.Compare(items[y].size, items[x].size); c != 0 {
			return c
		}
		return cmp.Compare(items[x].life.iv[0].from, items[y].life.iv[0].from)
	}
	slices.SortStableFunc(order, bySize)
	out, _ := packOrder(segs, fixed, items, page, order)
	return out
}

// packOrder packs items in the order given; see packBlocks.
func packOrder(segs []placed, fixed []placed, items []placeItem, page int64, order []int) ([]uintptr, *touched) {
	out := make([]uintptr, len(items))
	// byAddr holds what is placed so far, by address.
	var byAddr placedSet
	fixed = slices.Clone(fixed)
	slices.SortFunc(fixed, func(x, y placed) int { return cmp.Compare(x.addr, y.addr) })
	for _, f := range fixed {
		byAddr.insert(len(byAddr.addr), f)
	}
	segs = slices.Clone(segs)
	slices.SortFunc(segs, func(x, y placed) int { return cmp.Compare(x.addr, y.addr) })
	tp := newTouched(segs, page)
	for _, f := range fixed {
		tp.touch(f.addr, f.size)
	}
	for _, i := range order {
		it := &items[i]
		lo, hi := it.life.hull()
		best, bestGap, bestNew := uintptr(0), int64(-1), 0
		j := 0
		for si, sg := range segs {
			end := sg.addr + uintptr(sg.size)
			cur := sg.addr
			for j < len(byAddr.addr) && byAddr.addr[j] < sg.addr {
				j++
			}
			consider := func(gapEnd uintptr) {
				if gapEnd <= cur {
					return
				}
				g := int64(gapEnd - cur)
				if g < it.size {
					return
				}
				at, fresh := cur, tp.fresh(si, cur, it.size)
				if g > it.size {
					if hi := gapEnd - uintptr(it.size); tp.on() {
						if n := tp.fresh(si, hi, it.size); n < fresh {
							at, fresh = hi, n
						}
					}
				}
				if bestGap < 0 || fresh < bestNew || (fresh == bestNew && g < bestGap) {
					best, bestGap, bestNew = at, g, fresh
				}
			}
			for ; j < len(byAddr.addr) && byAddr.addr[j] < end; j++ {
				// The hulls first: most lives are one interval, and most
				// pairs do not meet.
				if byAddr.lo[j] >= hi || lo >= byAddr.hi[j] ||
					((it.life.n > 1 || byAddr.life[j].n > 1) && !byAddr.life[j].meets(it.life)) {
					continue
				}
				consider(byAddr.addr[j])
				cur = max(cur, byAddr.end[j])
			}
			consider(end)
		}
		if bestGap < 0 {
			continue
		}
		out[i] = best
		tp.touch(best, it.size)
		k, _ := slices.BinarySearch(byAddr.addr, best)
		byAddr.insert(k, placed{addr: best, size: it.size, life: it.life})
	}
	return out, tp
}

// touched is which pages of the ranges some placed block uses.
type touched struct {
	segs  []placed
	shift uint
	pages [][]bool
}

func newTouched(segs []placed, page int64) *touched {
	t := &touched{segs: segs}
	if page <= 0 {
		return t
	}
	t.shift = uint(bits.TrailingZeros64(uint64(page)))
	t.pages = make([][]bool, len(segs))
	for i, s := range segs {
		t.pages[i] = make([]bool, (s.size+page-1)>>t.shift)
	}
	return t
}

func (t *touched) on() bool { return t.pages != nil }

// fresh counts the pages of [addr, addr+size), in range si, no block uses.
func (t *touched) fresh(si int, addr uintptr, size int64) int {
	if t.pages == nil {
		return 0
	}
	lo, hi := t.span(si, addr, size)
	n := 0
	for _, u := range t.pages[si][lo:hi] {
		if !u {
			n++
		}
	}
	return n
}

func (t *touched) span(si int, addr uintptr, size int64) (lo, hi int) {
	off := int64(addr - t.segs[si].addr)
	return int(off >> t.shift), int((off+size-1)>>t.shift) + 1
}

func (t *touched) touch(addr uintptr, size int64) {
	if t.pages == nil {
		return
	}
	for si, s := range t.segs {
		if addr >= s.addr && addr < s.addr+uintptr(s.size) {
			lo, hi := t.span(si, addr, size)
			for k := lo; k < hi; k++ {
				t.pages[si][k] = true
			}
			return
		}
	}
}
