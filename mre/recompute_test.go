package mre

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// chainGraph is a small training step: L forward ops, each making an
// activation from the one before and a weight, saved for its backward op;
// a loss; L backward ops in reverse, each reading its activation.
func chainGraph(r *rand.Rand, L int) (*trace.Iteration, []float64) {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{}}
	id := trace.TensorID(0)
	tensor := func(kind trace.Kind, bytes int64) trace.TensorID {
		id++
		it.Tensors[id] = &trace.Tensor{ID: id, Bytes: bytes, Kind: kind, DType: "float32", Shape: []int64{bytes / 4}}
		return id
	}
	var times []float64
	op := func(name string, ph trace.Phase, us float64, in []trace.TensorID, out ...trace.TensorID) {
		it.Ops = append(it.Ops, trace.Op{Seq: len(it.Ops), Name: name, Phase: ph, In: in, Out: out, Mem: -1})
		times = append(times, us)
	}
	x := tensor(trace.KindInput, 1<<20)
	acts, ws := make([]trace.TensorID, L), make([]trace.TensorID, L)
	prev := x
	for i := range L {
		ws[i] = tensor(trace.KindParam, 1<<20)
		acts[i] = tensor(trace.KindActivation, int64(1+r.IntN(8))<<20)
		op("aten::mul", trace.PhaseForward, 10+r.Float64()*300, []trace.TensorID{prev, ws[i]}, acts[i])
		prev = acts[i]
	}
	g := tensor(trace.KindActivation, 1<<20)
	op("aten::loss", trace.PhaseForward, 20, []trace.TensorID{prev}, g)
	for i := L - 1; i >= 0; i-- {
		ng := tensor(trace.KindActivation, 1<<20)
		op("aten::mul_backward", trace.PhaseBackward, 20+r.Float64()*400, []trace.TensorID{g, acts[i], ws[i]}, ng)
		g = ng
	}
	return it, times
}

// bruteForce tries every keep / swap / recompute choice per activation and
// returns the fastest simulated iteration that meets the limit (-1 when
// none does). A swap frees its memory once its copy out is done and is
// brought back from the op before its use; a recompute is dropped after
// the forward and made again before its backward use, after the
// recomputes of the activations it reads (chains); an input the trace
// frees before a recompute is held for it.
func bruteForce(it *trace.Iteration, m *memory.Model, times []float64, limit int64, link simulate.Link) float64 {
	type gap struct {
		id         trace.TensorID
		bytes      int64
		prod, i, j int
	}
	var gaps []gap
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if lt.Tensor.Kind == trace.KindActivation && lt.ProducedHere() && len(lt.Uses) >= 2 {
			u := lt.Uses
			for x := 1; x < len(u); x++ {
				if int(u[x])-int(u[x-1]) >= 2 {
					gaps = append(gaps, gap{lt.Tensor.ID, lt.Bytes, lt.Alloc, int(u[x-1]), int(u[x])})
				}
			}
		}
	}
	best := -1.0
	choice := make([]int, len(gaps))
	var rec func(k int)
	rec = func(k int) {
		if k < len(gaps) {
			for c := range 3 {
				choice[k] = c
				rec(k + 1)
			}
			return
		}
		var swaps []simulate.Swap
		before := map[trace.TensorID]int{}
		for x, g := range gaps {
			switch choice[x] {
			case 1:
				swaps = append(swaps, simulate.Swap{Tensor: g.id, Bytes: g.bytes, Out: g.i, Free: -1, In: g.j - 1, Use: g.j})
			case 2:
				before[g.id] = g.j
			}
		}
		// A recompute that reads a recomputed tensor makes it need that
		// one first: at the earliest reader, down the chain.
		for changed := true; changed; {
			changed = false
			for x, g := range gaps {
				if choice[x] != 2 {
					continue
				}
				for _, in := range it.Ops[g.prod].In {
					if b, ok := before[in]; ok && before[g.id] < b {
						before[in], changed = before[g.id], true
					}
				}
			}
		}
		var rcs []simulate.Recompute
		for x, g := range gaps {
			if choice[x] == 2 {
				if before[g.id] <= g.i+1 {
					return
				}
				// An input the trace frees before the recompute is held for
				// it, as the planner counts it, unless it is recomputed too.
				var kept []simulate.Kept
				for _, id := range it.Ops[g.prod].In {
					l := m.Lifetime(id)
					if _, chained := before[id]; l == nil || chained || l.Tensor.Kind.Persistent() || l.Free > before[g.id] {
						continue
					}
					kept = append(kept, simulate.Kept{Tensor: id, Bytes: l.Bytes, From: l.Free})
				}
				rcs = append(rcs, simulate.Recompute{Tensor: g.id, Bytes: g.bytes, Op: g.prod, Drop: g.i, Before: before[g.id], Kept: kept})
			}
		}
		sortRecomputes(rcs)
		for _, s := range swaps {
			if s.In <= s.Out {
				return
			}
		}
		sim, err := simulate.Run(simulate.Input{OpTimes: times, Curve: m.Curve, Swaps: swaps, Recomputes: rcs, Link: link})
		if err != nil || sim.Peak > limit {
			return
		}
		if best < 0 || sim.IterationUS < best {
			best = sim.IterationUS
		}
	}
	rec(0)
	return best
}

// TestRecomputeAgainstBruteForce: on small random training steps, the
// planner with recompute is within 10% of the best keep / swap / recompute
// choice (in overhead points over the step, plus one point of slack), and
// never slower than swaps alone.
func TestRecomputeAgainstBruteForce(t *testing.T) {
	link := simulate.H200()
	compared := 0
	defer func() {
		t.Logf("%d of 30 instances compared", compared)
		assert.Greater(t, compared, 15, "instances compared")
	}()
	for seed := range 30 {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		it, times := chainGraph(r, 6)
		m := memory.Build(it, nil)
		limit := m.Peak * int64(45+r.IntN(40)) / 100
		name := fmt.Sprintf("seed %d, limit %d of %d", seed, limit, m.Peak)
		best := bruteForce(it, m, times, limit, link)
		all := make([]bool, len(it.Ops))
		for i := range all {
			all[i] = true
		}
		pol, err := Plan(Input{Model: m, Curve: m.Curve, OpTimes: times, Limit: limit, Recomputable: all}, WithMinBytes(0))
		if best < 0 {
			// No brute-force choice fits (its swaps have one timing); the
			// planner's, if any, must.
			if err == nil {
				assert.LessOrEqual(t, pol.Sim.Peak, limit, name)
			}
			continue
		}
		compared++
		require.NoError(t, err, name)
		require.LessOrEqual(t, pol.Sim.Peak, limit, name)
		base := pol.Sim.BaseUS
		got, want := (pol.Sim.IterationUS/base-1)*100, (best/base-1)*100
		assert.LessOrEqual(t, got, want*1.1+1, "%s: planner %.2f%% against the best %.2f%%", name, got, want)
		if swapOnly, err := Plan(Input{Model: m, Curve: m.Curve, OpTimes: times, Limit: limit}, WithMinBytes(0)); err == nil {
			assert.LessOrEqual(t, pol.Sim.IterationUS, swapOnly.Sim.IterationUS+1e-6, name)
		}
	}
}

// TestRecomputeBoundAgainstBruteForce: on small graphs, over links from the
// H200's down to one that hides little, no plan beats RecomputeBound: not
// the best keep / swap / recompute choice, not the planner's. Its copies-back
// term raises the bound in some of them (the bound with inRate 0 leaves
// it out).
func TestRecomputeBoundAgainstBruteForce(t *testing.T) {
	compared, bounded, incoming := 0, 0, 0
	for _, bw := range []float64{55e9, 4e9, 1e9} {
		link := simulate.H200().Scaled(bw)
		for seed := range 40 {
			r := rand.New(rand.NewPCG(uint64(seed), 11))
			it, times := chainGraph(r, 6)
			m := memory.Build(it, nil)
			limit := m.Peak * int64(45+r.IntN(40)) / 100
			name := fmt.Sprintf("%.0f GB/s, seed %d, limit %d of %d", bw/1e9, seed, limit, m.Peak)
			best := bruteForce(it, m, times, limit, link)
			if best < 0 {
				continue
			}
			all := make([]bool, len(it.Ops))
			for i := range all {
				all[i] = true
			}
			in := Input{Model: m, Curve: m.Curve, OpTimes: times, Limit: limit, Recomputable: all}
			b := RecomputeBound(in, link.D2H, link.H2D)
			if b.InOp >= 0 && b.OverheadPct > RecomputeBound(in, link.D2H, 0).OverheadPct {
				incoming++
			}
			var base float64
			for _, d := range times {
				base += d
			}
			want := (best/base - 1) * 100
			assert.LessOrEqual(t, b.OverheadPct, want+1e-9, "%s: bound %.2f%% over the best %.2f%%", name, b.OverheadPct, want)
			if pol, err := Plan(in, WithMinBytes(0), WithLink(link)); err == nil {
				assert.LessOrEqual(t, b.OverheadPct, pol.Sim.OverheadPct()+1e-9, "%s: the planner beat the bound", name)
			}
			compared++
			if b.OverheadPct > 0 {
				bounded++
			}
		}
	}
	t.Logf("%d instances compared, %d with a bound above zero, %d raised by the copies back", compared, bounded, incoming)
	assert.Greater(t, compared, 35, "instances compared")
	assert.Greater(t, bounded, 10, "instances with a bound above zero")
	assert.Greater(t, incoming, 5, "instances the copies back raise the bound in")
}

func TestRecomputable(t *testing.T) {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{
		1: {ID: 1, Kind: trace.KindActivation}, 2: {ID: 2, Kind: trace.KindActivation}, 3: {ID: 3, Kind: trace.KindParam},
	}}
	tests := []struct {
		op   trace.Op
		want bool
	}{
		{trace.Op{Name: "aten::mul", In: []trace.TensorID{1, 3}, Out: []trace.TensorID{2}}, true},
		{trace.Op{Name: "aten::silu", In: []trace.TensorID{1}, Out: []trace.TensorID{2}}, true},
		{trace.Op{Name: "aten::native_dropout", In: []trace.TensorID{1}, Out: []trace.TensorID{2}}, false},
		{trace.Op{Name: "aten::randn_like", In: []trace.TensorID{1}, Out: []trace.TensorID{2}}, false},
		{trace.Op{Name: "aten::empty_like", In: []trace.TensorID{1}, Out: []trace.TensorID{2}}, false},
		{trace.Op{Name: "aten::add_", In: []trace.TensorID{1, 2}, Out: []trace.TensorID{1}}, false},
		{trace.Op{Name: "aten::view", In: []trace.TensorID{1}, Out: []trace.TensorID{1}}, false},
		{trace.Op{Name: "aten::mul", Overload: "out", In: []trace.TensorID{1}, Out: []trace.TensorID{2}}, false},
		{trace.Op{Name: "aten::copy", In: []trace.TensorID{1}, Out: []trace.TensorID{3}}, false},
		{trace.Op{Name: "aten::sum", In: []trace.TensorID{1}}, false},
	}
	for _, tt := range tests {
		it.Ops = []trace.Op{tt.op}
		assert.Equal(t, tt.want, Recomputable(it)[0], "%+v", tt.op)
	}
}

// TestEarlyLeavesToSwapsWhatTheLinkCarries: early drops from the
// candidates exactly those whose copies out, queued in drop order, end
// before the first op over the limit in their gap, never one whose gap is
// under the limit throughout or whose recompute is cheap beside its copy.
func TestEarlyLeavesToSwapsWhatTheLinkCarries(t *testing.T) {
	link := simulate.H200()
	left := 0
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 11))
		it, times := chainGraph(r, 12)
		m := memory.Build(it, nil)
		limit := m.Peak * int64(50+r.IntN(40)) / 100
		need := make([]int64, len(m.Curve))
		for i, v := range m.Curve {
			need[i] = v - limit
		}
		all := make([]bool, len(it.Ops))
		for i := range all {
			all[i] = true
		}
		rcs := recomputeCandidates(m, m.Curve, limit, 0, all, times)
		kept := early(rcs, need, times, link.D2H)
		require.LessOrEqual(t, len(kept), len(rcs))
		type key struct {
			id           trace.TensorID
			drop, before int
		}
		in := map[key]bool{}
		for _, c := range kept {
			in[key{c.Tensor, c.Drop, c.Before}] = true
		}
		start := opStarts(times)
		free := 0.0
		byDrop := slices.Clone(rcs)
		slices.SortStableFunc(byDrop, func(a, b rcand) int { return cmp.Compare(a.Drop, b.Drop) })
		for _, c := range byDrop {
			first := -1
			for x := c.Drop + 1; x < c.Before; x++ {
				if need[x] > 0 {
					first = x
					break
				}
			}
			copyUS := float64(c.Bytes) / link.D2H * 1e6
			done := max(free, start[c.Drop+1]) + copyUS
			want := first >= 0 && c.cost >= copyUS/10 && done <= start[first]
			if want {
				free = done
				left++
			}
			assert.Equal(t, !want, in[key{c.Tensor, c.Drop, c.Before}], "seed %d: tensor %d dropped after op %d", seed, c.Tensor, c.Drop)
		}
	}
	assert.Positive(t, left, "some recompute left to swaps")
}

// TestRemakesDownAChain: a saved tensor whose input and that input's input
// were freed is made again from what is still on the device, the deepest
// first, or, as a second candidate, with its input held.
func TestRemakesDownAChain(t *testing.T) {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{}}
	tensor := func(id trace.TensorID, kind trace.Kind) {
		it.Tensors[id] = &trace.Tensor{ID: id, Bytes: 8 * mib, Kind: kind, DType: "float32", Shape: []int64{2 * mib}}
	}
	tensor(1, trace.KindParam)
	for id := trace.TensorID(2); id <= 8; id++ {
		tensor(id, trace.KindActivation)
	}
	it.Tensors[5].Bytes = 16 * mib // larger than its input: worth dropping with the input held
	op := func(name string, ph trace.Phase, in []trace.TensorID, out ...trace.TensorID) {
		it.Ops = append(it.Ops, trace.Op{Seq: len(it.Ops), Name: name, Phase: ph, In: in, Out: out, Mem: -1})
	}
	op("aten::mm", trace.PhaseForward, []trace.TensorID{1}, 2)         // x, saved
	op("aten::mul", trace.PhaseForward, []trace.TensorID{2}, 3)        // a
	op("aten::add", trace.PhaseForward, []trace.TensorID{3}, 4)        // b, a freed
	op("aten::tanh", trace.PhaseForward, []trace.TensorID{4}, 5)       // c, saved; b freed
	op("aten::sum", trace.PhaseForward, []trace.TensorID{5}, 6)        // the loss
	op("aten::ones_like", trace.PhaseBackward, []trace.TensorID{6}, 7) // the peak
	op("aten::mul", trace.PhaseBackward, []trace.TensorID{7, 5}, 8)    // reads c
	op("aten::mul", trace.PhaseBackward, []trace.TensorID{8, 2, 1}, 7) // reads x
	m := memory.Build(it, nil)
	times := []float64{100, 10, 10, 10, 10, 10, 50, 100}
	all := make([]bool, len(it.Ops))
	for i := range all {
		all[i] = true
	}
	rcs := recomputeCandidates(m, m.Curve, m.Peak-8*mib, 0, all, times)
	var deep, held *rcand
	for x := range rcs {
		if c := &rcs[x]; c.Tensor == 5 {
			if c.deep {
				deep = c
			} else {
				held = c
			}
		}
	}
	require.NotNil(t, deep, "%+v", rcs)
	require.NotNil(t, held, "%+v", rcs)
	assert.Equal(t, []simulate.Remade{{Tensor: 3, Bytes: 8 * mib, Op: 1}, {Tensor: 4, Bytes: 8 * mib, Op: 2}}, deep.Remade)
	assert.Empty(t, deep.Kept)
	assert.InDelta(t, 30, deep.cost, 1e-9, "tanh, add and mul")
	assert.Equal(t, []trace.TensorID{2}, deep.inputs, "x, on the device")
	assert.Empty(t, held.Remade)
	require.Len(t, held.Kept, 1)
	assert.Equal(t, trace.TensorID(4), held.Kept[0].Tensor)
	assert.InDelta(t, 10, held.cost, 1e-9)
	assert.Equal(t, int64(8*mib), held.net, "what holding b costs")
	assert.Equal(t, int64(16*mib), deep.net)
}

// TestHoldsAnInputFreedAtTheRecomputesOp: an input the curve frees at the
// op the recompute runs before (read last by the op just before it) is not
// on the device there, though the executor keeps it until the recompute
// has run: the candidate holds it through that op (Kept from it), and the
// simulation counts its bytes there. Counted as on the device, the layout
// laid the recompute's block over it.
func TestHoldsAnInputFreedAtTheRecomputesOp(t *testing.T) {
	it := &trace.Iteration{Tensors: map[trace.TensorID]*trace.Tensor{}}
	tensor := func(id trace.TensorID, kind trace.Kind, bytes int64) {
		it.Tensors[id] = &trace.Tensor{ID: id, Bytes: bytes, Kind: kind, DType: "float32", Shape: []int64{bytes / 4}}
	}
	tensor(1, trace.KindParam, 8*mib)
	tensor(2, trace.KindActivation, 8*mib)  // a
	tensor(3, trace.KindActivation, 32*mib) // b = f(a): dropped and made again
	for id := trace.TensorID(4); id <= 7; id++ {
		tensor(id, trace.KindActivation, 8*mib)
	}
	op := func(name string, ph trace.Phase, in []trace.TensorID, out ...trace.TensorID) {
		it.Ops = append(it.Ops, trace.Op{Seq: len(it.Ops), Name: name, Phase: ph, In: in, Out: out, Mem: -1})
	}
	op("aten::mm", trace.PhaseForward, []trace.TensorID{1}, 2)         // 0: a
	op("aten::mul", trace.PhaseForward, []trace.TensorID{2}, 3)        // 1: b = f(a)
	op("aten::tanh", trace.PhaseForward, []trace.TensorID{3}, 4)       // 2: reads b
	op("aten::ones_like", trace.PhaseBackward, []trace.TensorID{4}, 5) // 3: the peak
	op("aten::mul", trace.PhaseBackward, []trace.TensorID{5, 2}, 6)    // 4: reads a last
	op("aten::mul", trace.PhaseBackward, []trace.TensorID{6, 3}, 7)    // 5: reads b
	m := memory.Build(it, nil)
	a := m.Lifetime(2)
	require.NotNil(t, a)
	require.Equal(t, 5, a.Free, "a no longer counts at op 5")
	times := []float64{100, 10, 10, 10, 10, 10}
	all := make([]bool, len(it.Ops))
	for i := range all {
		all[i] = true
	}
	all[0] = false // a cannot be made again: held
	rcs := recomputeCandidates(m, m.Curve, m.Peak-8*mib, 0, all, times)
	var c *rcand
	for x := range rcs {
		if rcs[x].Tensor == 3 && rcs[x].Before == 5 && !rcs[x].deep {
			c = &rcs[x]
		}
	}
	require.NotNil(t, c, "%+v", rcs)
	assert.Equal(t, []simulate.Kept{{Tensor: 2, Bytes: 8 * mib, From: 5}}, c.Kept, "a, held through op 5")
	assert.Equal(t, int64(24*mib), c.net, "b's bytes less a's")

	sim, err := simulate.Run(simulate.Input{OpTimes: times, Curve: m.Curve, Recomputes: []simulate.Recompute{c.Recompute}, Link: simulate.H200()})
	require.NoError(t, err)
	// At op 5 the device holds b made again, a held for it and what the
	// curve counts there (b's 32 MiB is dropped over (2, 5) only).
	assert.Equal(t, m.Curve[5]+8*mib, sim.Ops[5].Mem, "a counted at op 5")
}
