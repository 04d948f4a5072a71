package device

import (
	"cmp"
	"slices"
)

// arena manages blocks inside segments of one address space (device or host).
// It is the shared core of Allocator and HostPool and is not safe for
// concurrent use: its owners hold a mutex.
//
// Free blocks sit in one slice sorted by (size, addr), so best fit is a binary
// search and the largest free block is the last element. Blocks of a segment
// form an address-ordered list so that freeing coalesces with both
// neighbours. Block structs and their pending slices are recycled, which
// keeps steady-state allocation and free off the Go heap.
type arena struct {
	align int64
	free  []*block
	used  map[uintptr]*block
	spare []*block
	segs  []segment

	reserved, allocated, peak int64
	// Pages of the mapped segments: the most that may be mapped, those
	// mapped, and those some used block overlaps (all in pages).
	budget, mappedPages, usedPages int64
	// frees counts frees: a block's freed stamp orders the blocks by when
	// their memory was given back.
	frees uint64
	// byAddr lists the free blocks by address while planned placement is
	// on (indexed), to find the free block holding a planned address.
	byAddr  []*block
	indexed bool
	// onRef counts references to pool-owned events, so that an event is
	// recorded again only once no free block refers to it.
	onRef func(idx int32, delta int)
}

type segment struct {
	addr uintptr
	size int64
	// head is the segment's first block. It never changes: splitting keeps
	// the lower part, coalescing keeps the lower block.
	head *block
	// pages is the page map of a segment of reserved address space (nil
	// for a segment of memory).
	pages *pageMap
}

type block struct {
	addr       uintptr
	size       int64
	seg        int
	prev, next *block
	free       bool
	// freed is the arena's free count when the newest memory in the block
	// was given back (coalescing keeps the newest).
	freed uint64
	// rec is 1 + the block's request number in repetition rep of a
	// recurring sequence (see Allocator.Repeat), 0 when not recorded.
	rec int32
	rep uint32
	// pending lists events whose captured work may still use the block's
	// memory; the next user must make its stream wait for them.
	pending []pend
	// cand is 1 + the block's index in the caller's list during window,
	// 0 otherwise.
	cand int32
}

// pend is one event guarding a free block, with the stream it was recorded
// on: a later user on that same stream needs no wait at all, because the
// stream runs in order. Events recorded by the pool itself (FreeOn) also have
// a known order, so a later one on a stream replaces an earlier one. A
// caller's events (FreeAfter) are only deduplicated: the pool cannot know the
// order in which they were recorded.
type pend struct {
	ev    Event
	s     Stream
	seq   uint64
	owned int32 // index into the pool's events, -1 for a caller's event
	// lo, hi is the memory freed behind the event (0, 0: all of the
	// block's). A piece cut from a free block keeps only the events over
	// its own bytes: memory given back next to a copy still in flight
	// does not wait for that copy.
	lo, hi uintptr
}

// guards reports whether e guards any byte of [lo, hi).
func (e pend) guards(lo, hi uintptr) bool { return e.hi == 0 || e.lo < hi && e.hi > lo }

func (p pend) known() bool { return p.owned >= 0 }

// maxPending bounds a block's pending list before the arena asks the device
// which events already completed.
const maxPending = 8

func newArena(align int64) arena {
	return arena{align: align, used: make(map[uintptr]*block)}
}

func (a *arena) roundUp(n int64) int64 {
	return (n + a.align - 1) / a.align * a.align
}

func (a *arena) newBlock() *block {
	if n := len(a.spare); n > 0 {
		b := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return b
	}
	return &block{}
}

func (a *arena) recycle(b *block) {
	p := b.pending[:0]
	*b = block{pending: p}
	a.spare = append(a.spare, b)
}

// addSegment adds [addr, addr+size) as one free block and returns its index.
func (a *arena) addSegment(addr uintptr, size int64) int {
	b := a.newBlock()
	a.segs = append(a.segs, segment{addr: addr, size: size, head: b})
	b.addr, b.size, b.seg, b.free = addr, size, len(a.segs)-1, true
	a.insertFree(b)
	a.reserved += size
	return b.seg
}

func freeCmp(x *block, size int64, addr uintptr) int {
	if c := cmp.Compare(x.size, size); c != 0 {
		return c
	}
	return cmp.Compare(x.addr, addr)
}

func (a *arena) insertFree(b *block) {
	i, _ := slices.BinarySearchFunc(a.free, b, func(x, t *block) int { return freeCmp(x, t.size, t.addr) })
	a.free = slices.Insert(a.free, i, b)
	if a.indexed {
		j, _ := slices.BinarySearchFunc(a.byAddr, b.addr, addrCmp)
		a.byAddr = slices.Insert(a.byAddr, j, b)
	}
}

func (a *arena) removeFree(b *block) {
	i, ok := slices.BinarySearchFunc(a.free, b, func(x, t *block) int { return freeCmp(x, t.size, t.addr) })
	if !ok {
		panic("device: arena free list out of sync")
	}
	a.dropFreeAt(i)
}

// dropFreeAt takes a.free[i] off the free lists.
func (a *arena) dropFreeAt(i int) {
	b := a.free[i]
	a.free = slices.Delete(a.free, i, i+1)
	if a.indexed {
		j, ok := slices.BinarySearchFunc(a.byAddr, b.addr, addrCmp)
		if !ok {
			panic("device: arena address index out of sync")
		}
		a.byAddr = slices.Delete(a.byAddr, j, j+1)
	}
}

func addrCmp(x *block, addr uintptr) int { return cmp.Compare(x.addr, addr) }

// index starts keeping the free blocks by address.
func (a *arena) index() {
	if a.indexed {
		return
	}
	a.indexed = true
	a.byAddr = append(a.byAddr[:0], a.free...)
	slices.SortFunc(a.byAddr, func(x, y *block) int { return cmp.Compare(x.addr, y.addr) })
}

// freeHolding is the index in a.free of the free block that holds
// [addr, addr+size), -1 when no free block does.
func (a *arena) freeHolding(addr uintptr, size int64) int {
	j, ok := slices.BinarySearchFunc(a.byAddr, addr, addrCmp)
	if !ok {
		j--
	}
	if j < 0 {
		return -1
	}
	b := a.byAddr[j]
	if b.addr+uintptr(b.size) < addr+uintptr(size) {
		return -1
	}
	i, _ := slices.BinarySearchFunc(a.free, b, func(x, t *block) int { return freeCmp(x, t.size, t.addr) })
	return i
}

// preferCandidates bounds how many free blocks take asks, beyond the best
// fit, whether they need a wait (a device query each); oldestCandidates how
// many it compares by age when none is ready.
const (
	preferCandidates = 8
	oldestCandidates = 64
)

// take returns the best-fitting free block of at least size bytes (size is
// already rounded), split so that it is exactly size when the rest is worth
// keeping. The remainder inherits the pending events: it is the same memory
// that was freed behind them. nil means nothing fits.
//
// ready, when not nil, says whether a block can be used without waiting:
// among the preferCandidates best-fitting blocks the first ready one is
// taken, so that a request does not queue behind a copy still in flight
// when an idle block of about the same size is free.
func (a *arena) take(size int64, ready func(*block) bool) *block {
	i := a.firstFit(size)
	if i == len(a.free) {
		return nil
	}
	if ready != nil {
		// The first ready candidate among the best fits; failing that, the
		// fitting block freed longest ago. Its copy is the earliest queued,
		// so the wait is the shortest: the best fit alone would often be the
		// block freed last, behind every copy in flight. A host that runs
		// ahead of its device finds no block ready, and then this is what
		// keeps reuse in the order the memory was given back.
		oldest, found := i, false
		for j := i; j < len(a.free) && j < i+oldestCandidates; j++ {
			if j < i+preferCandidates && ready(a.free[j]) {
				i, found = j, true
				break
			}
			if a.free[j].freed < a.free[oldest].freed {
				oldest = j
			}
		}
		if !found {
			i = oldest
		}
	}
	return a.takeAt(i, size)
}

// firstFit is the index of the smallest free block of at least size bytes,
// len(a.free) when none is that large.
func (a *arena) firstFit(size int64) int {
	i, _ := slices.BinarySearchFunc(a.free, size, func(x *block, s int64) int {
		if x.size < s {
			return -1
		}
		return 1
	})
	return i
}

// splitFree splits the free block a.free[i] at off bytes (a multiple of
// the alignment, inside it) into two free blocks, and returns the index of
// the second in the free list. Both keep the block's pending events.
func (a *arena) splitFree(i int, off int64) int {
	b := a.free[i]
	a.dropFreeAt(i)
	r := a.cut(b, off)
	a.insertFree(b)
	a.insertFree(r)
	j, _ := slices.BinarySearchFunc(a.free, r, func(x, t *block) int { return freeCmp(x, t.size, t.addr) })
	return j
}

// cut shortens b to its first at bytes and returns the rest as a new free
// block after it. Each piece keeps the pending events over its bytes.
func (a *arena) cut(b *block, at int64) *block {
	r := a.newBlock()
	r.addr, r.size, r.seg, r.free, r.freed = b.addr+uintptr(at), b.size-at, b.seg, true, b.freed
	mid, end := r.addr, r.addr+uintptr(r.size)
	keep := b.pending[:0]
	for _, e := range b.pending {
		inB, inR := e.guards(b.addr, mid), e.guards(mid, end)
		switch {
		case inB && inR:
			a.ref(e, 1)
			keep = append(keep, e)
			r.pending = append(r.pending, e)
		case inB:
			keep = append(keep, e)
		case inR:
			r.pending = append(r.pending, e)
		default:
			a.ref(e, -1)
		}
	}
	clear(b.pending[len(keep):])
	b.pending = keep
	r.prev, r.next = b, b.next
	if b.next != nil {
		b.next.prev = r
	}
	b.next = r
	b.size = at
	return r
}

// takeFrom hands out size bytes at offset off (a multiple of the
// alignment) of the free block a.free[i].
func (a *arena) takeFrom(i int, off, size int64) *block {
	if off > 0 {
		i = a.splitFree(i, off)
	}
	return a.takeAt(i, size)
}

// takeAt hands out size bytes at the start of the free block a.free[i].
func (a *arena) takeAt(i int, size int64) *block {
	b := a.free[i]
	a.dropFreeAt(i)
	if rest := b.size - size; rest >= a.align {
		a.insertFree(a.cut(b, size))
	}
	b.free = false
	if seg := &a.segs[b.seg]; seg.pages != nil {
		a.usePages(seg, b, 1)
	}
	a.used[b.addr] = b
	a.allocated += b.size
	a.peak = max(a.peak, a.allocated)
	return b
}

// give returns the used block at addr to the free list, guarded by e when
// hasEv, and coalesces it with free neighbours. It reports false for an
// address that is not a live block.
func (a *arena) give(addr uintptr, e pend, hasEv bool) (*block, bool) {
	b, ok := a.used[addr]
	if !ok {
		return nil, false
	}
	delete(a.used, addr)
	if seg := &a.segs[b.seg]; seg.pages != nil {
		a.usePages(seg, b, -1)
	}
	a.allocated -= b.size
	b.free = true
	a.frees++
	b.freed = a.frees
	if hasEv {
		e.lo, e.hi = b.addr, b.addr+uintptr(b.size)
		b.pending = a.merge(b.pending, e)
	}
	if p := b.prev; p != nil && p.free {
		a.removeFree(p)
		p.size += b.size
		p.freed = max(p.freed, b.freed)
		p.pending = a.merge(p.pending, b.pending...)
		b.pending = b.pending[:0]
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		}
		a.recycle(b)
		b = p
	}
	if n := b.next; n != nil && n.free {
		a.removeFree(n)
		b.size += n.size
		b.freed = max(b.freed, n.freed)
		b.pending = a.merge(b.pending, n.pending...)
		n.pending = n.pending[:0]
		b.next = n.next
		if n.next != nil {
			n.next.prev = b
		}
		a.recycle(n)
	}
	a.insertFree(b)
	return b, true
}

// merge adds es to dst, which takes over their references. Of two events
// the pool recorded on one stream only the later is kept; a caller's event
// is kept once. The one kept guards the memory of both.
func (a *arena) merge(dst []pend, es ...pend) []pend {
next:
	for _, e := range es {
		for i, d := range dst {
			switch {
			case e.known() && d.known() && e.s == d.s:
				if e.seq > d.seq {
					dst[i] = e
					a.ref(d, -1)
				} else {
					a.ref(e, -1)
				}
				dst[i].lo, dst[i].hi = guarded(d, e)
				continue next
			case !e.known() && !d.known() && e.ev == d.ev:
				dst[i].lo, dst[i].hi = guarded(d, e)
				continue next
			}
		}
		dst = append(dst, e)
	}
	return dst
}

// guarded is the memory two events guard together (0, 0: all).
func guarded(x, y pend) (uintptr, uintptr) {
	if x.hi == 0 || y.hi == 0 {
		return 0, 0
	}
	return min(x.lo, y.lo), max(x.hi, y.hi)
}

// ref adjusts the reference count of a pool-owned event.
func (a *arena) ref(e pend, delta int) {
	if e.owned >= 0 && a.onRef != nil {
		a.onRef(e.owned, delta)
	}
}

// release drops every pending event of b.
func (a *arena) release(b *block) {
	for _, e := range b.pending {
		a.ref(e, -1)
	}
	clear(b.pending)
	b.pending = b.pending[:0]
}

// prune drops caller events that done reports complete. Errors keep the
// event: waiting on it later is always safe.
func (a *arena) prune(b *block, done func(Event) (bool, error)) {
	keep := b.pending[:0]
	for _, e := range b.pending {
		if !e.known() {
			if ok, err := done(e.ev); err == nil && ok {
				continue
			}
		}
		keep = append(keep, e)
	}
	clear(b.pending[len(keep):])
	b.pending = keep
}

func (a *arena) stats() Stats {
	s := Stats{
		Reserved:      a.reserved,
		Allocated:     a.allocated,
		PeakAllocated: a.peak,
		Free:          a.reserved - a.allocated,
		Segments:      len(a.segs),
		FreeBlocks:    len(a.free),
		InUse:         len(a.used),
	}
	if n := len(a.free); n > 0 {
		s.LargestFree = a.free[n-1].size
	}
	if s.Free > 0 {
		s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.Free)
	}
	for _, b := range a.free {
		if len(b.pending) > 0 {
			s.PendingBlocks++
		}
	}
	return s
}

// Stats describes an Allocator or HostPool.
type Stats struct {
	// Reserved is the memory obtained from the backend, in bytes.
	Reserved int64
	// Allocated is the memory in blocks handed out (rounded sizes).
	Allocated int64
	// PeakAllocated is the highest Allocated seen.
	PeakAllocated int64
	// Free is Reserved minus Allocated.
	Free int64
	// LargestFree is the size of the largest free block: the largest request
	// that can succeed without growth.
	LargestFree int64
	// Fragmentation is 1 - LargestFree/Free (0 when nothing is free): the
	// share of free memory that the largest request cannot use.
	Fragmentation float64
	// Segments counts backend allocations held.
	Segments int
	// FreeBlocks and InUse count blocks on each side.
	FreeBlocks, InUse int
	// PendingBlocks counts free blocks still guarded by events.
	PendingBlocks int
	// BackendAllocs counts calls to the backend's allocation function, which
	// must stay flat on the hot path once the pool is warm.
	BackendAllocs int64

	// On an allocator set up with ReserveMapped, Reserved is the page
	// budget and LargestFree is bounded by the pages left in it. PageSize
	// is the device's page size (0 otherwise), Mapped the bytes of pages
	// mapped now, Maps and Unmaps count the device calls, and HostWaits the
	// events the host waited for to unmap a range still in use by queued
	// work. Maps must stay flat once the allocator is warm.
	PageSize, Mapped int64
	// InPages is the bytes of the pages some block uses: what the budget
	// holds against Reserved. Above Allocated by the unused parts of
	// partly used pages.
	InPages      int64
	Maps, Unmaps int64
	HostWaits    int64
	// MappedPages and UnmappedPages count the pages those calls mapped and
	// unmapped (the budget mapped up front is not counted): each costs
	// driver time, tens of microseconds on CUDA.
	MappedPages, UnmappedPages int64

	// Placed counts the requests of repeated sequences served at their
	// planned address, Missed those with a plan served elsewhere, and
	// Placements the plans made (see Allocator.Repeat), and GaveUp the
	// times placement ended because a sequence did not recur closely
	// enough (two repetitions in a row that missed too many places).
	Placed, Missed, Placements, GaveUp int64
}
