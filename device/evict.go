package device

import "fmt"

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
	var bestFirst, bestLast *block
	var bestCost int64
	var bestAge uint64
	for s := range a.segs {
		for first := a.segs[s].head; first != nil; first = first.next {
			// A run that starts right after a free block is beaten by the
			// one that starts at that block: same cost, more bytes.
			if !movable(first) || (first.prev != nil && first.prev.free) {
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
				if got += b.size; got >= need {
					if bestFirst == nil || cost < bestCost || (cost == bestCost && age < bestAge) {
						bestFirst, bestLast, bestCost, bestAge = first, b, cost, age
					}
					break
				}
			}
		}
	}
	if bestFirst == nil {
		return dst, false
	}
	for b := bestFirst; ; b = b.next {
		if !b.free {
			dst = append(dst, int(b.cand-1))
		}
		if b == bestLast {
			break
		}
	}
	return dst, true
}
