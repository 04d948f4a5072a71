// Package memory is the memory model of an iteration (the detailed
// profile): for every storage an iteration touches, the op that allocates
// it, every use and the last use, which storages live across iterations, and
// from that the allocated-bytes curve op by op.
//
// The model is checked against the recorded curve (torch.cuda.memory_allocated
// after each op) of real traces. What it has to get right, and why:
//   - Storage ids name allocations, so views and in-place results (same id)
//     cost nothing new; only the first appearance of an id as an output
//     allocates.
//   - A storage is released after its last reference in the iteration unless
//     a later iteration still uses it (gradients kept for the optimizer,
//     optimizer state created in the first step): those are live-out.
//   - Storages used before they are produced in this iteration are live-in
//     (parameters, optimizer state, inputs, last step's gradients).
//   - The caching allocator rounds every block up to device.BlockSize (512
//     bytes).
//   - The host frees a storage when its last reference drops, which can be
//     later than its last use by an op: a model's output held by the caller
//     until the step ends, a loop variable rebound on the next trip,
//     gradients kept until zero_grad. When the iteration carries a recorded
//     curve, Build reads each release off it (see inferReleases); without
//     one, a storage goes at its last use, and a gradient (made in backward,
//     last read by the optimizer) at the end of the iteration.
package memory

import (
	"cmp"
	"slices"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/trace"
)

// RoundBytes rounds a storage size up to the allocator's block size
// (device.BlockSize, the granularity of PyTorch's CUDA caching allocator
// too: memory_allocated counts blocks rounded up to it).
func RoundBytes(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return (n + device.BlockSize - 1) / device.BlockSize * device.BlockSize
}

// Lifetime is one storage's life inside an iteration.
type Lifetime struct {
	Tensor *trace.Tensor
	Bytes  int64 // allocated bytes (rounded)
	// Alloc is the op that allocates it, -1 when it is live at entry.
	Alloc int
	// Free is the first op index at which it no longer counts: by default
	// the op after its last use; later when the recorded curve shows the
	// host kept it; len(ops) when it outlives the iteration.
	Free int
	// Uses are the op indices that reference it (inputs or outputs), in order.
	Uses    []int32
	LiveIn  bool
	LiveOut bool
}

// LastUse is the last op referencing the storage, -1 when none does.
func (l *Lifetime) LastUse() int {
	if len(l.Uses) == 0 {
		return -1
	}
	return int(l.Uses[len(l.Uses)-1])
}

// ProducedHere reports whether an op of the iteration makes the storage
// (it is not live at entry): what a swap of an activation needs, since the
// iteration itself brings it into being.
func (l *Lifetime) ProducedHere() bool { return !l.LiveIn && l.Alloc >= 0 }

// Model is the memory model of one iteration.
type Model struct {
	Iter *trace.Iteration
	// Lifetimes of every storage the iteration references, in order of first
	// reference.
	Lifetimes []Lifetime
	// Index maps a storage id to its position in Lifetimes.
	Index map[trace.TensorID]int32
	// Base is the bytes allocated at entry that no op of the iteration
	// references, anchored on the recorded curve when there is one.
	Base int64
	// Curve is the modeled allocated bytes after each op.
	Curve []int64
	// Peak is the largest value of Curve, PeakOp where it happens.
	Peak   int64
	PeakOp int
}

// Lifetime is the lifetime of storage id, nil when no op references it.
func (m *Model) Lifetime(id trace.TensorID) *Lifetime {
	k, ok := m.Index[id]
	if !ok {
		return nil
	}
	return &m.Lifetimes[k]
}

// LiveOutFunc tells whether a storage is still used after the iteration.
// A nil LiveOutFunc treats only persistent kinds (params, optimizer state)
// as live-out.
type LiveOutFunc func(id trace.TensorID) bool

// Build derives the memory model of it. liveOut decides which storages
// survive the iteration; with a whole trace at hand use LiveOutFromTrace.
func Build(it *trace.Iteration, liveOut LiveOutFunc) *Model {
	m := &Model{Iter: it, Index: make(map[trace.TensorID]int32, len(it.Tensors))}
	n := len(it.Ops)
	get := func(id trace.TensorID, i int, isOut bool) *Lifetime {
		k, ok := m.Index[id]
		if !ok {
			t := it.Tensors[id]
			lt := Lifetime{Tensor: t, Bytes: RoundBytes(t.Bytes), Alloc: -1}
			if isOut && !t.Kind.Persistent() && t.Kind != trace.KindInput {
				lt.Alloc = i
			} else {
				lt.LiveIn = true
			}
			k = int32(len(m.Lifetimes))
			m.Lifetimes = append(m.Lifetimes, lt)
			m.Index[id] = k
		}
		return &m.Lifetimes[k]
	}
	for i := range it.Ops {
		op := &it.Ops[i]
		for _, id := range op.In {
			lt := get(id, i, false)
			lt.Uses = appendUse(lt.Uses, i)
		}
		for _, id := range op.Out {
			lt := get(id, i, true)
			lt.Uses = appendUse(lt.Uses, i)
		}
	}
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		t := lt.Tensor
		switch {
		case t.Kind.Persistent() || (liveOut != nil && liveOut(t.ID)):
			lt.LiveOut = true
			lt.Free = n
		case !it.HasMem() && isGradient(it, lt):
			lt.Free = n
		default:
			lt.Free = lt.LastUse() + 1
		}
	}
	if it.HasMem() {
		m.inferReleases()
	}
	m.curve()
	return m
}

// isGradient reports a storage made in backward and last read by the
// optimizer: frameworks keep gradients until the next step zeroes them.
func isGradient(it *trace.Iteration, lt *Lifetime) bool {
	return lt.Alloc >= 0 && it.Ops[lt.Alloc].Phase == trace.PhaseBackward &&
		lt.LastUse() >= 0 && it.Ops[lt.LastUse()].Phase == trace.PhaseOptimizer
}

// releaseSlack absorbs allocator noise (rounding, small bookkeeping
// allocations) when matching releases against the recorded curve.
const releaseSlack = 64 << 10

// fits reports whether a storage of n bytes can be what a drop of budget
// bytes released. A drop can be a little short of the storages it freed:
// an op may keep a small allocation of its own that no trace line names
// (on mixtral8-eager a 46 MB release shows as a 45.5 MB drop), so a
// storage fits within 3% of its size.
func fits(n, budget int64) bool { return n <= budget+n/32 }

// fitsExact is fits for an exact curve (trace.Iteration.MemExact).
func fitsExact(n, budget int64) bool { return n <= budget }

// inferReleases moves each storage's release to where the recorded curve
// shows it. An op's last use is the earliest a storage can go; the recorded
// drop after op i tells how many bytes really went. Storages due at i that
// do not fit in that drop are kept pending (largest first, as the big ones
// are what a caller holds: logits, saved outputs) and released later, at the
// first drop they fit. Nothing is ever released before its last use, so the
// inferred lifetimes are always safe for planning.
//
// A curve the Engine recorded itself (MemExact) has no noise to absorb: a
// storage goes exactly where the curve shows its bytes go, with no slack,
// so a host that holds a tensor past its last use is modelled holding it.
func (m *Model) inferReleases() {
	ops := m.Iter.Ops
	slack, fit := int64(releaseSlack), fits
	// size is what a storage weighs in the curve: rounded as an allocator
	// rounds, but as its bytes in an exact curve, which counts them so.
	size := func(lt *Lifetime) int64 { return lt.Bytes }
	if m.Iter.MemExact {
		slack, fit = 0, fitsExact
		size = func(lt *Lifetime) int64 { return lt.Tensor.Bytes }
	}
	n := len(ops)
	due := make([][]int32, n+1)
	allocAt := make([]int64, n)
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if lt.Alloc >= 0 {
			allocAt[lt.Alloc] += size(lt)
		}
		if lt.Free < n {
			due[lt.Free] = append(due[lt.Free], int32(k))
		}
	}
	var pending []int32
	bySizeDesc := func(s []int32) {
		slices.SortFunc(s, func(a, b int32) int {
			return cmp.Compare(m.Lifetimes[b].Bytes, m.Lifetimes[a].Bytes)
		})
	}
	for i := 1; i < n; i++ {
		freed := ops[i-1].Mem + allocAt[i] - ops[i].Mem
		budget := freed + slack
		bySizeDesc(due[i])
		// Release the smallest due storages first: they fit whatever drop
		// there is; the big ones wait for a drop that shows them.
		for j := len(due[i]) - 1; j >= 0; j-- {
			lt := &m.Lifetimes[due[i][j]]
			if lt.Free != i {
				continue // released early, inside its last op
			}
			if fit(size(lt), budget) {
				budget -= size(lt)
				continue
			}
			pending = append(pending, due[i][j])
		}
		if budget <= 2*slack {
			continue
		}
		bySizeDesc(pending)
		kept := pending[:0]
		for _, k := range pending {
			lt := &m.Lifetimes[k]
			if fit(size(lt), budget) {
				budget -= size(lt)
				lt.Free = i
				continue
			}
			kept = append(kept, k)
		}
		pending = kept
		// A drop still unexplained is storages whose last use is this very
		// op, released as it returns (an autograd node dropping what it
		// saved): they stop counting after op i.
		if budget <= 2*slack {
			continue
		}
		bySizeDesc(due[i+1])
		for _, k := range due[i+1] {
			lt := &m.Lifetimes[k]
			if fit(size(lt), budget) {
				budget -= size(lt)
				lt.Free = i
			}
		}
	}
	for _, k := range pending {
		m.Lifetimes[k].Free = n
	}
}

func appendUse(u []int32, i int) []int32 {
	if len(u) > 0 && u[len(u)-1] == int32(i) {
		return u
	}
	return append(u, int32(i))
}

// curve computes the allocated-bytes curve by a difference array over
// [Alloc, Free) intervals, then anchors it on the recorded curve.
func (m *Model) curve() {
	n := len(m.Iter.Ops)
	delta := make([]int64, n+1)
	var entry int64
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if lt.Alloc < 0 {
			entry += lt.Bytes
		} else {
			delta[lt.Alloc] += lt.Bytes
		}
		delta[lt.Free] -= lt.Bytes
	}
	m.Curve = make([]int64, n)
	cur := entry
	for i := 0; i < n; i++ {
		cur += delta[i]
		m.Curve[i] = cur
	}
	if m.Iter.HasMem() && n > 0 {
		// What no op references (other params of the model not used in this
		// iteration, buffers) is invisible to the model: read it off the
		// recorded curve at the first op.
		m.Base = m.Iter.Ops[0].Mem - m.Curve[0]
	}
	m.Peak, m.PeakOp = 0, 0
	for i := range m.Curve {
		m.Curve[i] += m.Base
		if m.Curve[i] > m.Peak {
			m.Peak, m.PeakOp = m.Curve[i], i
		}
	}
}

// LiveOutFromTrace returns, for iteration k of tr, the storages that a
// later iteration still references, but a storage iteration k makes in its
// backward that the next iteration to reference it first uses in its
// forward: no forward reads what a backward made (a gradient), so the id
// names another tensor there, put by the allocator in the block the
// gradient left (the next batch's inputs in the final norm's gradient's
// block, on the recorded llama traces), and the gradient is not kept.
func LiveOutFromTrace(tr *trace.Trace, k int) LiveOutFunc {
	later := make(map[trace.TensorID]struct{})
	cur := tr.Iterations[k]
	for _, it := range tr.Iterations[k+1:] {
		for id := range it.Tensors {
			if _, ok := cur.Tensors[id]; ok {
				later[id] = struct{}{}
			}
		}
	}
	// Made in the backward: the first op to list it lists it as an output.
	seen := make(map[trace.TensorID]bool, len(cur.Tensors))
	var made []trace.TensorID
	for i := range cur.Ops {
		op := &cur.Ops[i]
		for _, id := range op.In {
			seen[id] = true
		}
		for _, id := range op.Out {
			if !seen[id] && op.Phase == trace.PhaseBackward {
				if _, ok := later[id]; ok && !cur.Tensors[id].Kind.Persistent() {
					made = append(made, id)
				}
			}
			seen[id] = true
		}
	}
	// The phase of the first op that lists each id in an iteration, read
	// once per iteration asked.
	first := map[int]map[trace.TensorID]trace.Phase{}
	phaseIn := func(j int) map[trace.TensorID]trace.Phase {
		if f, ok := first[j]; ok {
			return f
		}
		it := tr.Iterations[j]
		f := make(map[trace.TensorID]trace.Phase, len(it.Tensors))
		for i := range it.Ops {
			op := &it.Ops[i]
			for _, ids := range [2][]trace.TensorID{op.In, op.Out} {
				for _, id := range ids {
					if _, ok := f[id]; !ok {
						f[id] = op.Phase
					}
				}
			}
		}
		first[j] = f
		return f
	}
	for _, id := range made {
		for j := k + 1; j < len(tr.Iterations); j++ {
			if _, ok := tr.Iterations[j].Tensors[id]; !ok {
				continue
			}
			if ph, ok := phaseIn(j)[id]; ok && ph == trace.PhaseForward {
				delete(later, id)
			}
			break
		}
	}
	return func(id trace.TensorID) bool { _, ok := later[id]; return ok }
}
