package plan

import (
	"cmp"
	"slices"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan/place"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Layout is where the blocks of a planned iteration go in device memory:
// the plan's memory as the allocator must hold it, blocks at addresses,
// rather than as a byte count. A plan whose bytes fit the limit can still
// need more memory than the limit as blocks: a block freed in the middle of
// others leaves a hole that only a block of its size or less can take, and
// where memory is mapped a page at a time a block that shares a page with
// another keeps the page in use. Make plans, lays the plan out, and plans
// again for less until it fits (Result.Held: where blocks lie above the
// limit; or lower at every op), keeping the faster plan that fits; the
// executor then serves each block at its offset (chameleon's Engine, through
// device.Allocator.AllocAt), so what runs is what was planned.
type Layout struct {
	// Page is the unit memory is mapped in; 0 when the blocks must fit in
	// one range of Budget bytes.
	Page int64
	// Budget is the device memory the blocks must fit in, in bytes.
	Budget int64
	// Blocks are the iteration's blocks, each with its offset (Off, from
	// the start of the device memory; -1 when no room was found).
	Blocks []Block
	// Touched is the pages some block uses at some point of the iteration
	// (all of them stay mapped when no page moves), Most the most pages in
	// use at one op; with no pages, both are the bytes up to the highest
	// block's end.
	Touched, Most int64
	// Live is the most bytes the blocks hold at one op: the plan's peak.
	Live int64
	// Unplaced counts the blocks no range had room for.
	Unplaced int
}

// BlockKind says what takes a block's memory.
type BlockKind uint8

const (
	// Entry is a tensor live when the iteration begins: a parameter,
	// optimizer state, what the last iteration left.
	Entry BlockKind = iota
	// Made is an op's output, allocated before op Op runs; Index is its
	// ordinal among the storages that op makes, in the order they were
	// made (their ids).
	Made
	// SwapIn is the copy back of swap Index, taken at op Op.
	SwapIn
	// Recompute is the tensor recompute Index makes again before op Op.
	Recompute
	// Remade is an input made again for the recomputes before op Op.
	Remade
	// Unreferenced is the bytes no op references (memory.Model.Base):
	// memory the trace's curve held beside its tensors.
	Unreferenced
)

// Block is one block of device memory of a planned iteration: Size bytes
// over Life (op indices: from the op that takes the memory to the first op
// at which it is free again), what takes it, and where the layout put it.
type Block struct {
	Size   int64
	Life   place.Life
	Tensor trace.TensorID
	Kind   BlockKind
	// Op is the op at whose start (Made: before which) the memory is
	// taken; Index the ordinal, swap or recompute (see BlockKind). A block
	// whose Life has a second interval from 0 is also where the tensor
	// is when the iteration begins: taken at Op, kept into the next.
	Op, Index int
	// Off is the block's offset in the layout, -1 when unplaced.
	Off int64
}

// Need is the device bytes the layout needs: every page it touches, or
// every byte up to its highest block.
func (l *Layout) Need() int64 {
	if l.Page > 0 {
		return max(l.Touched, l.Most) * l.Page
	}
	return l.Touched
}

// Top is the budget the device can map: its whole pages (page 0: all of
// it). A block that reaches into the budget's last partial page is over.
func (l *Layout) Top() int64 {
	if l.Page > 0 {
		return l.Budget / l.Page * l.Page
	}
	return l.Budget
}

// Fits reports whether the layout fits the budget with no page moved.
func (l *Layout) Fits() bool { return l.Unplaced == 0 && l.Need() <= l.Top() }

// Over is the bytes the layout needs beyond the budget's whole pages (0
// when it fits).
func (l *Layout) Over() int64 { return max(0, l.Need()-l.Top()) }

// LayOut packs the blocks of the planned iteration r (its memory model, its
// policy and the simulation of the policy as the executor issues it) into
// budget bytes of memory mapped page bytes at a time (page 0: one range),
// with the packer the device's allocator places a recurring step with
// (place.Pack): the largest block first, each where it adds the fewest
// pages. It is pure.
func LayOut(r *Result, page, budget int64) *Layout {
	blocks := Blocks(r)
	l := &Layout{Page: page, Budget: budget}
	// Address 0 means unplaced to the packer: the blocks go from one page
	// (or block) on, and are reported from 0. As the device reserves it,
	// the address space is twice the budget, so that the packer can place
	// a block anew while as much again is held.
	base := uintptr(max(page, device.BlockSize))
	space := 2 * max(budget, 1)
	if page > 0 {
		space = (space + page - 1) / page * page
	}
	n := int32(len(r.Curve))
	items := make([]place.Item, len(blocks))
	for i := range blocks {
		b := &blocks[i]
		if b.Kind == Made && b.Life.N == 1 && b.Life.IV[0].To == n && b.Size <= max(page, budget>>10) {
			// Made here and kept past the end with nothing of the
			// iteration before to pair with (pairAcross): a value the host
			// keeps for the next step and releases there with no op
			// reading it (a loss, a scalar). The one made last iteration
			// is in its place from the start until this one is made; small
			// ones keep the place for it, rather than have the model
			// guess when that one goes.
			b.Life = place.Life{N: 2, IV: [2]place.Span{b.Life.IV[0], {From: 0, To: int32(b.Op)}}}
		}
		items[i] = place.Item{Size: b.Size, Life: b.Life}
	}
	addrs := place.Pack([]place.Placed{{Addr: base, Size: space}}, nil, items, page)
	for i := range blocks {
		blocks[i].Off = -1
		if addrs[i] == 0 {
			l.Unplaced++
			continue
		}
		blocks[i].Off = int64(addrs[i] - base)
	}
	l.Blocks = blocks
	var at []place.Placed
	for _, b := range blocks {
		if b.Off < 0 {
			continue
		}
		at = append(at, place.Placed{Addr: uintptr(b.Off), Size: b.Size, Life: b.Life})
		if page <= 0 {
			l.Touched = max(l.Touched, b.Off+b.Size)
		}
	}
	if page > 0 {
		l.Touched, l.Most = place.Pages(at, page)
	} else {
		l.Most = l.Touched
	}
	l.Live = liveBytes(at)
	return l
}

// liveBytes is the most bytes of blocks whose lives hold one op.
func liveBytes(blocks []place.Placed) int64 {
	type edge struct {
		at int32
		d  int64
	}
	var edges []edge
	for _, b := range blocks {
		for _, v := range b.Life.IV[:b.Life.N] {
			edges = append(edges, edge{v.From, b.Size}, edge{v.To, -b.Size})
		}
	}
	slices.SortFunc(edges, func(x, y edge) int { return cmp.Or(cmp.Compare(x.at, y.at), cmp.Compare(x.d, y.d)) })
	var cur, most int64
	for _, e := range edges {
		cur += e.d
		most = max(most, cur)
	}
	return most
}

// Blocks lists the device blocks of the planned iteration r, each with its
// life in op indices: every storage of the memory model from the op that
// allocates it (0 when it is live at entry) to the first op it no longer
// counts at (the op count when it outlives the iteration), less its gaps
// off the device: a swap's from the op its memory counts free at (the
// executor's simulation) to the op its copy back is issued at, a wrapping
// swap's before its copy back and after its memory is free, a recompute's
// from after the op it is dropped after to the op it is remade before. An
// input held for a recompute lives on to the recompute's op; an input made
// again for one is a block of its own over that op. The bytes no op
// references (memory.Model.Base) are one block over the whole iteration.
// At each op the blocks hold what the policy's simulated curve holds.
//
// Its steps: the policy's holes (blockHoles.swaps, blockHoles.recomputes),
// the ordinals of the storages each op makes (madeOrdinals), the pairs
// across the iteration's end (pairAcross), then one or more blocks per
// storage in the model's order (blockHoles.lifetime), then the remade
// inputs' blocks by op and tensor (blockHoles.remadeBlocks).
func Blocks(r *Result) []Block {
	m := r.Model
	n := int32(len(m.Curve))
	var out []Block
	if m.Base > 0 {
		out = append(out, Block{Size: m.Base, Life: place.Once(0, n), Kind: Unreferenced})
	}
	bh := blockHoles{n: n, holes: map[trace.TensorID][]hole{}, hold: map[trace.TensorID]int32{}, remade: map[remadeAt]int64{},
		ordinal: map[trace.TensorID]int{}}
	if p := r.Policy; p != nil {
		var freed []int
		if r.Exec != nil {
			freed = r.Exec.Freed
		} else if p.Sim != nil {
			freed = p.Sim.Freed
		}
		bh.swaps(p.Swaps, freed)
		bh.recomputes(p.Recomputes)
	}
	madeOrdinals(m, bh.ordinal)
	pairs := bh.pairAcross(m)
	for k := range m.Lifetimes {
		out = bh.lifetime(out, &m.Lifetimes[k], pairs)
	}
	return bh.remadeBlocks(out)
}

// blockHoles is what Blocks gathers from the policy before it lays out the
// storages: each storage's gaps off the device, how far an input held for a
// recompute lives, the inputs made again, and the ordinals of the storages
// ops make. n is the op count.
type blockHoles struct {
	n       int32
	holes   map[trace.TensorID][]hole
	hold    map[trace.TensorID]int32 // a kept input: lives up to this op
	remade  map[remadeAt]int64       // an input made again before an op: its bytes
	ordinal map[trace.TensorID]int   // a made storage: its ordinal among its op's
}

// remadeAt is an input made again for the recomputes before op op.
type remadeAt struct {
	id trace.TensorID
	op int
}

// swaps adds the holes of swaps, swap k off the device from the op its
// memory counted free at (freed[k] where known, else Free; the op after
// Out when dynamic) to the op its copy back is issued at; a wrapping
// swap's holes are [0, In) and [freed, n), or [freed-n, In) when it is
// freed in the next iteration (its place kept over the ops before).
func (bh *blockHoles) swaps(swaps []simulate.Swap, freed []int) {
	n := bh.n
	for k, s := range swaps {
		f := int32(s.Free)
		if k < len(freed) {
			f = int32(freed[k])
		}
		if s.Wraps() && f > n {
			bh.holes[s.Tensor] = append(bh.holes[s.Tensor], hole{place.Span{From: f - n, To: int32(s.In)}, SwapIn, k})
			continue
		}
		if s.Wraps() {
			bh.holes[s.Tensor] = append(bh.holes[s.Tensor], hole{place.Span{From: 0, To: int32(s.In)}, SwapIn, k},
				hole{place.Span{From: f, To: n}, SwapIn, k})
			continue
		}
		if f < 0 {
			f = int32(s.Out + 1)
		}
		bh.holes[s.Tensor] = append(bh.holes[s.Tensor], hole{place.Span{From: f, To: int32(s.In)}, SwapIn, k})
	}
}

// recomputes adds the holes of rcs, each tensor off the device from after
// the op it is dropped after to the op it is remade before, holds each
// kept input up to the last recompute's op, and records the inputs made
// again, once per op.
func (bh *blockHoles) recomputes(rcs []simulate.Recompute) {
	for k, rc := range rcs {
		bh.holes[rc.Tensor] = append(bh.holes[rc.Tensor], hole{place.Span{From: int32(rc.Drop + 1), To: int32(rc.Before)}, Recompute, k})
		for _, x := range rc.Kept {
			bh.hold[x.Tensor] = max(bh.hold[x.Tensor], int32(rc.Before+1))
		}
		for _, x := range rc.Remade {
			bh.remade[remadeAt{x.Tensor, rc.Before}] = x.Bytes
		}
	}
}

// madeOrdinals sets in ordinal each storage an op makes to its ordinal
// among the op's, in the order they were made (their ids): the name a Made
// block is known by. (The caller makes the map, so that it can stay on
// the stack.)
func madeOrdinals(m *memory.Model, ordinal map[trace.TensorID]int) {
	made := map[int][]trace.TensorID{}
	for k := range m.Lifetimes {
		if lt := &m.Lifetimes[k]; !lt.LiveIn && lt.Alloc >= 0 {
			made[lt.Alloc] = append(made[lt.Alloc], lt.Tensor.ID)
		}
	}
	for _, ids := range made {
		slices.Sort(ids)
		for i, id := range ids {
			ordinal[id] = i
		}
	}
}

// lifetime appends lt's blocks to out: its life from Alloc (0 when live
// at entry) to Free (at most n, at least its hold), cut at its holes. The
// made storage of a pair across the iteration's end (pairs) has its last
// piece kept into the next iteration, which frees it where its pair is
// freed; the pair's freed half has none. Any other resident at both ends
// with gaps between has its last piece and its first as one block.
func (bh *blockHoles) lifetime(out []Block, lt *memory.Lifetime, pairs map[trace.TensorID]int) []Block {
	n := bh.n
	in, paired := pairs[lt.Tensor.ID]
	if paired && in < 0 {
		return out // the freed half of a pair
	}
	first := Block{Size: lt.Bytes, Tensor: lt.Tensor.ID, Kind: Entry}
	from, to := int32(0), min(int32(lt.Free), n)
	if !lt.LiveIn && lt.Alloc >= 0 {
		from = int32(lt.Alloc)
		first.Kind, first.Op, first.Index = Made, lt.Alloc, bh.ordinal[lt.Tensor.ID]
	}
	if h, ok := bh.hold[lt.Tensor.ID]; ok {
		to = min(max(to, h), n)
	}
	k0 := len(out)
	out = appendPieces(out, first, from, to, bh.holes[lt.Tensor.ID])
	if paired {
		// Its last place, to the end, kept into the next iteration,
		// which frees it at in's Free: one block across the end.
		b := &out[len(out)-1]
		b.Life = place.Life{N: 2, IV: [2]place.Span{b.Life.IV[0], {From: 0, To: int32(in)}}}
		return out
	}
	if last := len(out) - 1; last > k0 && out[k0].Life.IV[0].From == 0 && out[last].Life.IV[0].To == n {
		// Resident at both ends with gaps between: where the last piece
		// ends one iteration, the first begins the next, so the two
		// are one block.
		out[last].Life = place.Life{N: 2, IV: [2]place.Span{out[last].Life.IV[0], out[k0].Life.IV[0]}}
		out = slices.Delete(out, k0, k0+1)
	}
	return out
}

// remadeBlocks appends to out a block per input made again, over the op
// it is made for, by op then tensor.
func (bh *blockHoles) remadeBlocks(out []Block) []Block {
	keys := make([]remadeAt, 0, len(bh.remade))
	for k := range bh.remade {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y remadeAt) int { return cmp.Or(cmp.Compare(x.op, y.op), cmp.Compare(x.id, y.id)) })
	for _, k := range keys {
		out = append(out, Block{Size: memory.RoundBytes(bh.remade[k]), Life: place.Once(int32(k.op), int32(k.op+1)),
			Tensor: k.id, Kind: Remade, Op: k.op})
	}
	return out
}

// pairAcross pairs what an iteration makes and keeps past its end with
// what, in the same place, the iteration frees of what the one before kept:
// on the device they are one block, made in one iteration and freed in the
// next (a value a step keeps for the next). Storages of the same size pair
// in the order they were made; a pair is one block when the one kept is
// freed before the next takes its last place, the one it is in at the
// end: where it is made, or where it comes back to when the plan moves it
// off the device (swapped out, dropped) before that (a gradient the
// optimizer reads and the next step's forward reads again, brought back
// for the optimizer: the two values' lives cross, its last place's and
// the one kept's do not). The result maps the made storage to the op its
// pair is freed at, and the freed one to -1.
func (bh *blockHoles) pairAcross(m *memory.Model) map[trace.TensorID]int {
	holes, n := bh.holes, bh.n
	byIn, byOut := map[int64][]*memory.Lifetime{}, map[int64][]*memory.Lifetime{}
	last := map[trace.TensorID]int32{} // a made storage: where its last place begins
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if lt.Tensor.Kind.Persistent() {
			continue
		}
		switch {
		case lt.LiveIn && !lt.LiveOut && bh.freed(lt) < n && len(holes[lt.Tensor.ID]) == 0:
			byIn[lt.Bytes] = append(byIn[lt.Bytes], lt)
		case !lt.LiveIn && lt.Alloc >= 0 && int32(lt.Free) >= n:
			from, ok := lastPlace(int32(lt.Alloc), n, holes[lt.Tensor.ID])
			if !ok {
				continue // off the device at the end
			}
			last[lt.Tensor.ID] = from
			byOut[lt.Bytes] = append(byOut[lt.Bytes], lt)
		}
	}
	pairs := map[trace.TensorID]int{}
	for size, outs := range byOut {
		ins := byIn[size]
		slices.SortFunc(ins, func(x, y *memory.Lifetime) int { return cmp.Compare(x.Tensor.ID, y.Tensor.ID) })
		slices.SortFunc(outs, func(x, y *memory.Lifetime) int { return cmp.Compare(x.Tensor.ID, y.Tensor.ID) })
		for i := range min(len(ins), len(outs)) {
			if f := bh.freed(ins[i]); f <= last[outs[i].Tensor.ID] {
				pairs[outs[i].Tensor.ID] = int(f)
				pairs[ins[i].Tensor.ID] = -1
			}
		}
	}
	return pairs
}

// freed is the op at which lt's memory is free: its Free, or later where
// a recompute keeps it as an input (hold).
func (bh *blockHoles) freed(lt *memory.Lifetime) int32 {
	f := int32(lt.Free)
	if h, ok := bh.hold[lt.Tensor.ID]; ok {
		f = max(f, h)
	}
	return f
}

// lastPlace is the op at which a storage made at from and resident at the
// end n (holes its gaps off the device) takes its last place: from, or the
// end of its last gap; false when a gap reaches the end.
func lastPlace(from, n int32, holes []hole) (int32, bool) {
	for _, h := range holes {
		if h.span.To >= n || h.span.From >= n {
			return 0, false
		}
		from = max(from, h.span.To)
	}
	return from, true
}

// hole is a gap of a storage off the device, and what brings it back.
type hole struct {
	span  place.Span
	kind  BlockKind
	index int
}

// appendPieces appends the pieces of [from, to) outside holes, the first
// as first says, each later one as the hole before it says.
func appendPieces(out []Block, first Block, from, to int32, holes []hole) []Block {
	if len(holes) > 1 {
		holes = slices.Clone(holes)
		slices.SortFunc(holes, func(x, y hole) int { return cmp.Compare(x.span.From, y.span.From) })
	}
	cur, b := from, first
	for _, h := range holes {
		if h.span.From > cur {
			if e := min(h.span.From, to); e > cur {
				b.Life = place.Once(cur, e)
				out = append(out, b)
			}
		}
		// An empty hole at cur (a swap whose copy back is issued at the
		// op its memory counts free at, as a wrapping swap's issued at
		// the iteration's first op) still begins the swap's block: its
		// copy back is served at that block's place.
		if h.span.To > cur || h.span.From == h.span.To && h.span.To == cur {
			cur = h.span.To
			b = Block{Size: first.Size, Tensor: first.Tensor, Kind: h.kind, Op: int(cur), Index: h.index}
		}
	}
	if to > cur {
		b.Life = place.Once(cur, to)
		out = append(out, b)
	}
	return out
}
