package chameleon

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/plan/place"
	"github.com/chameleon-go/chameleon/trace"
)

// policyLayout is where a policy's blocks go in device memory: the plan's
// layout (plan.Layout), by what takes each block, so that the executor asks
// the allocator for each block at its planned offset (AllocAt) and the
// step runs in the memory the plan counted, placed from its first
// iteration. A block the layout did not foresee (another sequence, a shape
// that moved, a host allocation) is served off the layout's pages.
type policyLayout struct {
	// blocks are the layout's blocks at their offsets: what the allocator
	// follows (device.Allocator.Follow).
	blocks []place.Placed
	// made is an op's outputs by op, rounded size and ordinal among that
	// op's outputs of that size; in and rc per swap and recompute (-1: no
	// place); remade the inputs made again, by tensor and op.
	made   map[madeKey]int64
	in, rc []int64
	remade map[remadeKey]int64
	// entry is where the layout has each tensor live when the iteration
	// begins, and its size: a parameter or optimizer state elsewhere is
	// moved there.
	entry map[trace.TensorID]spot
	// byAddr is blocks by address, with ends[i] the highest end of
	// byAddr[:i+1]; atStart the offsets of the blocks in use when the
	// iteration begins, with their sizes (clearLayout).
	byAddr  []place.Placed
	ends    []int64
	atStart map[int64]int64
}

type spot struct{ off, size int64 }

// unlaidTiers are the shares of the limit a policy that runs without a
// layout (an update of one from elsewhere) is planned for in turn: the
// room below the limit is what lets the allocator place blocks it was not
// told where to put.
var unlaidTiers = []int{90, 95, 100}

type madeKey struct {
	op   int
	size int64
	n    int
}

type remadeKey struct {
	id trace.TensorID
	op int
}

// newPolicyLayout indexes l for a policy of nswaps swaps and nrcs
// recomputes; nil when there is no layout or it does not fit the limit
// (the allocator then places blocks as it records them, Allocator.Repeat).
func newPolicyLayout(l *plan.Layout, nswaps, nrcs int) *policyLayout {
	if l == nil || !l.Fits() {
		return nil
	}
	pl := &policyLayout{made: map[madeKey]int64{}, in: make([]int64, nswaps), rc: make([]int64, nrcs), remade: map[remadeKey]int64{},
		entry: map[trace.TensorID]spot{}, atStart: map[int64]int64{}}
	for i := range pl.in {
		pl.in[i] = -1
	}
	for i := range pl.rc {
		pl.rc[i] = -1
	}
	var made []*plan.Block
	for i := range l.Blocks {
		b := &l.Blocks[i]
		if b.Off < 0 {
			continue
		}
		pl.blocks = append(pl.blocks, place.Placed{Addr: uintptr(b.Off), Size: b.Size, Life: b.Life})
		if b.Kind == plan.Entry && b.Life.IV[0].From == 0 || b.Life.N == 2 && b.Life.IV[1].From == 0 {
			// In use when the iteration begins: live in, or kept from
			// the iteration before.
			pl.atStart[b.Off] = max(pl.atStart[b.Off], b.Size)
		}
		switch b.Kind {
		case plan.Entry:
			if b.Life.IV[0].From == 0 {
				pl.entry[b.Tensor] = spot{b.Off, b.Size}
			}
		}
		if b.Life.N == 2 && b.Life.IV[1].From == 0 && b.Kind != plan.Made {
			pl.entry[b.Tensor] = spot{b.Off, b.Size}
		}
		switch b.Kind {
		case plan.Made:
			made = append(made, b)
		case plan.SwapIn:
			if b.Index < nswaps {
				pl.in[b.Index] = b.Off
			}
		case plan.Recompute:
			if b.Index < nrcs {
				pl.rc[b.Index] = b.Off
			}
		case plan.Remade:
			pl.remade[remadeKey{b.Tensor, b.Op}] = b.Off
		}
	}
	pl.byAddr = slices.Clone(pl.blocks)
	slices.SortFunc(pl.byAddr, func(x, y place.Placed) int { return cmp.Compare(x.Addr, y.Addr) })
	pl.ends = make([]int64, len(pl.byAddr))
	var hi int64
	for i, b := range pl.byAddr {
		hi = max(hi, int64(b.Addr)+b.Size)
		pl.ends[i] = hi
	}
	// An op's outputs are counted by size, in the order the op made them
	// (their ordinals): the host makes them in that order each iteration.
	slices.SortFunc(made, func(x, y *plan.Block) int { return cmp.Or(cmp.Compare(x.Op, y.Op), cmp.Compare(x.Index, y.Index)) })
	count := map[madeKey]int{}
	for _, b := range made {
		k := madeKey{op: b.Op, size: b.Size}
		n := count[k]
		count[k]++
		k.n = n
		pl.made[k] = b.Off
	}
	return pl
}

// madeAt is the offset of the next output the host makes for op (NewTensor),
// -1 when the layout has none: the n-th of its size for that op.
func (it *Iteration) madeAt(p *policy, size int64) int64 {
	if !it.active || p == nil || p.layout == nil {
		return -1
	}
	if it.madeOp != it.op || it.madeN == nil {
		it.madeOp = it.op
		if it.madeN == nil {
			it.madeN = map[int64]int{}
		}
		clear(it.madeN)
	}
	r := memory.RoundBytes(size)
	k := madeKey{op: it.op, size: r, n: it.madeN[r]}
	it.madeN[r]++
	if off, ok := p.layout.made[k]; ok {
		return off
	}
	return -1
}

// at is the offset of slot k of offs, -1 when there is none.
func at(offs []int64, k int) int64 {
	if k < 0 || k >= len(offs) {
		return -1
	}
	return offs[k]
}

// layoutGiveUp: a layout is dropped after two iterations in a row in which
// more than one in layoutGiveUp of the blocks with a place missed it: the
// step does not recur closely enough (a decode loop's cache grows every
// step, an MoE's experts get other tokens), and best fit serves it better.
// No later policy of that op sequence is placed either (giveUpPlacing): a
// plan made again from another of its steps meets the same change. On
// the H200 at c36c6fd, Mixtral's steps at 80% of its peak that were
// placed, missing 150-670 places, took 169-237 ms; those on best fit
// 54-81 ms.
const layoutGiveUp = 10

// giveUpPlacing ends placement for p's op sequence (Engine.unplaced).
func (e *Engine) giveUpPlacing(p *policy) {
	if e.unplaced[p.key.Hash] {
		return
	}
	if e.unplaced == nil {
		e.unplaced = map[uint64]bool{}
	}
	e.unplaced[p.key.Hash] = true
	e.cfg.logger.Info("chameleon: blocks miss their planned places two steps in a row: this op sequence runs on best fit from now on",
		"ops", p.key.Ops, "layout", p.layout != nil)
}

// follow points the allocator at the layout of the policy in force, or at
// none, and, at each iteration's start while it follows one, moves the
// parameters and optimizer state resident elsewhere than the layout has
// them to their places (relocate) and what the host holds over the
// layout's blocks off them (clearLayout).
func (e *Engine) follow(p *policy) error {
	var lay *policyLayout
	if p != nil {
		lay = p.layout
	}
	st := e.alloc.Stats()
	placed, missed := st.Placed-e.placedAt, st.Missed-e.missedAt
	e.placedAt, e.missedAt = st.Placed, st.Missed
	if lay != nil && lay == e.following && missed*layoutGiveUp > placed+missed {
		if e.offLayout++; e.offLayout >= 2 {
			e.giveUpPlacing(p)
		}
	} else {
		e.offLayout = 0
	}
	if lay != nil && e.unplaced[p.key.Hash] {
		p.layout, lay = nil, nil
	}
	if lay != e.following {
		e.following = lay
		if lay == nil {
			e.alloc.Follow(nil)
		} else {
			e.alloc.Follow(lay.blocks)
		}
	}
	if lay == nil {
		return nil
	}
	// Every iteration: what could not move to its place before (a place
	// then taken) may move now.
	if err := e.relocate(lay); err != nil {
		return err
	}
	return e.clearLayout(lay)
}

// clearLayout moves, at the start of an iteration that follows lay, each
// activation the host still holds from an iteration before that lies on a
// block of lay without being in a block lay has in use at the start, off
// lay's pages (where there is room). The layout gave it a place for the
// life the profiled iteration saw; held longer (a host keeps a value a step
// longer than in the step profiled), it takes the place of every block
// planned over it, iteration after iteration: on the host replay of
// llama16-bf16 at a quarter of its peak, one 128-byte value took the place
// of 70 blocks a step.
func (e *Engine) clearLayout(lay *policyLayout) error {
	if len(lay.byAddr) == 0 {
		return nil
	}
	for _, t := range e.live {
		if t.kind.persistent() || t.released || t.state != resident || t.ptr == 0 {
			continue
		}
		off, ok := e.alloc.Offset(t.ptr)
		if !ok {
			continue
		}
		if size, ok := lay.atStart[off]; ok && size >= memory.RoundBytes(t.size) {
			continue
		}
		// The blocks that begin before its end: one reaching past off
		// overlaps it.
		i, _ := slices.BinarySearchFunc(lay.byAddr, off+t.size, func(b place.Placed, x int64) int { return cmp.Compare(int64(b.Addr), x) })
		if i == 0 || lay.ends[i-1] <= off {
			continue
		}
		if _, err := e.move(t, -1); err != nil {
			return err
		}
	}
	return nil
}

// relocate moves each resident parameter and optimizer state to where lay
// has it when the iteration begins, with one copy on the compute stream
// (queued before the iteration's first kernel; the old memory is freed
// behind it). Where a tensor's place is taken by others still to move (the
// places of a new layout cross the old ones), those that could not move
// first go off the layout's pages, then each to its place. One whose place
// stays taken stays where it is, and the blocks planned over it are served
// elsewhere.
func (e *Engine) relocate(lay *policyLayout) error {
	var blocked []*Tensor
	for pass := 0; pass < 3; pass++ {
		blocked = blocked[:0]
		for _, t := range e.live {
			at, ok := lay.entry[t.id]
			off := at.off
			if !ok || at.size != memory.RoundBytes(t.size) || !t.kind.persistent() || t.released || t.state != resident || t.ptr == 0 {
				continue // not the tensor profiled (a policy from elsewhere)
			}
			if cur, ok := e.alloc.Offset(t.ptr); ok && cur == off {
				continue
			}
			ok, err := e.move(t, off)
			if err != nil {
				return err
			}
			if !ok {
				blocked = append(blocked, t)
			}
		}
		if len(blocked) == 0 || pass > 0 {
			break
		}
		// Out of the way, off the layout's pages, then to their places.
		for _, t := range blocked {
			if _, err := e.move(t, -1); err != nil {
				return err
			}
		}
	}
	return nil
}

// move copies resident t to offset off of the allocator's memory (-1:
// anywhere free, off the layout's pages where it can), reporting false when
// that place is taken.
func (e *Engine) move(t *Tensor, off int64) (bool, error) {
	var ptr device.DevPtr
	var err error
	if off >= 0 {
		ptr, err = e.alloc.Place(t.size, e.compute, off)
	} else {
		ptr, err = e.alloc.AllocAside(t.size, e.compute)
	}
	if errors.Is(err, device.ErrOutOfMemory) {
		return false, nil
	}
	if err != nil {
		return false, faulted("relocation", t, err)
	}
	if err := e.dev.CopyD2D(ptr, t.ptr, t.size, e.compute); err != nil {
		return false, faulted("relocation", t, err, func() error { return e.alloc.Free(ptr) })
	}
	if err := e.settleWriteBack(t); err != nil {
		return false, faulted("relocation", t, err, func() error { return e.alloc.Free(ptr) })
	}
	// The old block is the allocator's once FreeOn returns, error or not.
	old := t.ptr
	t.ptr = ptr
	if err := e.alloc.FreeOn(old, e.compute); err != nil {
		return false, faulted("relocation", t, err)
	}
	if off >= 0 {
		e.stats.Relocated++
	}
	return true, nil
}

// logMiss logs (CHAMELEON_DEBUG=layout) a block served away from offset off
// of the layout, and the tensors that hold that place.
func (e *Engine) logMiss(what string, off int64, ptr device.DevPtr, size int64) {
	l := e.cfg.layoutLog
	if l == nil || off < 0 {
		return
	}
	if got, ok := e.alloc.Offset(ptr); ok && got == off {
		return
	}
	got, _ := e.alloc.Offset(ptr)
	var holders []string
	for _, u := range e.live {
		if u.ptr == 0 {
			continue
		}
		if uo, ok := e.alloc.Offset(u.ptr); ok && uo < off+size && off < uo+u.size {
			holders = append(holders, fmt.Sprintf("tensor %d (%d bytes at %d, kind %d, state %d, released %v, holds %d, swap %d)",
				u.id, u.size, uo, u.kind, u.state, u.released, u.holds, u.plan))
		}
	}
	st := e.alloc.Stats()
	l.Debug("layout miss", "what", what, "iteration", e.stats.Iterations, "op", e.it.op, "bytes", size, "want", off, "got", got,
		"held_by", strings.Join(holders, "; "), "in_pages", st.InPages, "reserved", st.Reserved)
}
