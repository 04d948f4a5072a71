package trace_test

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/trace"
)

// TestSplitRealTraces splits the recorded traces' optimizer steps and
// checks that the pieces hold exactly the op's tensors, a parameter with
// its gradient and state in each piece, that the shares of each op add up
// to one, and that the curve never rises inside an op that writes in place.
func TestSplitRealTraces(t *testing.T) {
	for _, name := range []string{testtraces.Small, "llama16-bf16.jsonl.gz", "llama7b-8l-bf16.jsonl.gz",
		"mixtral8-eager-bf16.jsonl.gz", "llama16-lora.jsonl.gz", "llama16-fp16-scaler.jsonl.gz"} {
		t.Run(name, func(t *testing.T) {
			tr := testtraces.Read(t, name)
			split, origins := trace.SplitTrace(tr)
			require.Len(t, split.Iterations, len(tr.Iterations))
			var fused, pieces int
			for k, it := range tr.Iterations {
				s, org := split.Iterations[k], origins[k]
				require.Len(t, org, len(s.Ops))
				share := make([]float64, len(it.Ops))
				refs := make([]map[trace.TensorID]int, len(it.Ops))
				for j, o := range org {
					require.True(t, j == 0 || o.Op >= org[j-1].Op, "origins in order")
					share[o.Op] += o.Share
					require.Equal(t, j, s.Ops[j].Seq)
					require.Equal(t, it.Ops[o.Op].Name, s.Ops[j].Name)
					if refs[o.Op] == nil {
						refs[o.Op] = map[trace.TensorID]int{}
					}
					for _, id := range slices.Concat(s.Ops[j].In, s.Ops[j].Out) {
						refs[o.Op][id]++
					}
				}
				for i := range it.Ops {
					require.InDelta(t, 1, share[i], 1e-9, "op %d", i)
					op := &it.Ops[i]
					p, ok := trace.Divide(it, op)
					want := map[trace.TensorID]int{}
					for _, id := range slices.Concat(op.In, op.Out) {
						want[id]++
					}
					if ok {
						pieces += p.N
						for _, id := range op.In[p.N*p.Lists:] {
							want[id] += p.N - 1 // every piece lists the shared ones
						}
					}
					require.Equal(t, want, refs[i], "op %d (%s): the pieces list what the op lists", i, op.Name)
					if op.Name != "aten::_fused_adamw_" {
						continue
					}
					fused++
					require.True(t, ok, "op %d: %s divides", i, op.Name)
					require.Equal(t, 5, p.Lists, "params, grads, exp_avg, exp_avg_sq, steps")
					for x := range p.N {
						in, _ := p.Piece(op, x)
						param, grad, m, v := it.Tensors[in[0]], it.Tensors[in[1]], it.Tensors[in[2]], it.Tensors[in[3]]
						require.Equal(t, trace.KindParam, param.Kind)
						require.Equal(t, trace.KindActivation, grad.Kind, "a gradient")
						require.Equal(t, param.Bytes, grad.Bytes)
						require.Equal(t, trace.KindOptState, m.Kind)
						require.Equal(t, trace.KindOptState, v.Kind)
					}
				}
				if !it.HasMem() {
					continue
				}
				for j := 1; j < len(s.Ops); j++ {
					if org[j].Op == org[j-1].Op && len(s.Ops[j].Out) == 0 {
						require.LessOrEqual(t, s.Ops[j].Mem, s.Ops[j-1].Mem, "op %d: an in-place piece allocates nothing", j)
					}
					require.LessOrEqual(t, s.Ops[j].Mem, it.Ops[org[j].Op].Mem+1, "op %d: the curve never rises over the recording", j)
				}
				// The memory model takes the split iteration as it is.
				m := memory.Build(s, memory.LiveOutFromTrace(split, k))
				require.Len(t, m.Curve, len(s.Ops))
			}
			if name != "llama16-fp16-scaler.jsonl.gz" {
				require.Positive(t, fused, "a fused optimizer step in every iteration")
			}
			require.Positive(t, pieces)
		})
	}
}

// TestSplitFloor: the fused optimizer step holds every parameter, gradient
// and optimizer state at once; split, the largest op it leaves is one
// piece, a few parameters' worth.
func TestSplitFloor(t *testing.T) {
	tr := testtraces.Read(t, "llama16-bf16.jsonl.gz")
	it := tr.Iterations[1]
	split, _ := trace.Split(it)
	most := func(it *trace.Iteration, opt bool) int64 {
		var m int64
		for i := range it.Ops {
			op := &it.Ops[i]
			if (op.Phase == trace.PhaseOptimizer) != opt {
				continue
			}
			var b int64
			for _, id := range slices.Concat(op.In, op.Out) {
				b += it.Tensors[id].Bytes
			}
			m = max(m, b)
		}
		return m
	}
	before, after := most(it, true), most(split, true)
	require.Greater(t, before, int64(6<<30), "the whole step lists over 6 GiB")
	require.Less(t, after, int64(600<<20), "one piece lists under 600 MiB")
	require.Equal(t, most(it, false), most(split, false), "the other ops are as they were")
}

// twoParams returns the tensors of a two-parameter optimizer step:
// parameters 1 and 2 of 100 and 300 bytes, their gradients 3 and 4, state
// 5 to 8, and one more tensor per parameter at off past it (its bytes by
// the parameter's, of kind k); add declares more.
func twoParams(off trace.TensorID, bytes func(int64) int64, k trace.Kind) (map[trace.TensorID]*trace.Tensor, func(trace.TensorID, int64, trace.Kind)) {
	ts := map[trace.TensorID]*trace.Tensor{}
	add := func(id trace.TensorID, bytes int64, k trace.Kind) {
		ts[id] = &trace.Tensor{ID: id, Bytes: bytes, Kind: k}
	}
	for i, b := range []int64{100, 300} {
		id := trace.TensorID(i + 1)
		add(id, b, trace.KindParam)
		add(id+2, b, trace.KindActivation)
		add(id+4, b, trace.KindOptState)
		add(id+6, b, trace.KindOptState)
		add(id+off, bytes(b), k)
	}
	return ts, add
}

// TestSplitCurve: a piece gets its share of its op's time, and the curve
// after it is the op's carried from the op before by the share done.
func TestSplitCurve(t *testing.T) {
	// Two parameters (1, 2), their gradients (3, 4), state (5, 6, 7, 8),
	// and what a foreach op makes of them (10, 11).
	ts, _ := twoParams(9, func(b int64) int64 { return b }, trace.KindActivation)
	it := &trace.Iteration{Tensors: ts, Ops: []trace.Op{
		{Name: "aten::mm", In: []trace.TensorID{1, 2}, Mem: 1000, DurUS: 10},
		{Name: "aten::_foreach_mul", Phase: trace.PhaseOptimizer, In: []trace.TensorID{3, 4}, Out: []trace.TensorID{10, 11}, Mem: 1400, DurUS: 8},
		{Name: "aten::_fused_adamw_", Phase: trace.PhaseOptimizer, In: []trace.TensorID{1, 2, 3, 4, 5, 6, 7, 8}, Mem: 1400, DurUS: 40},
	}}
	s, org := trace.Split(it)
	require.Len(t, s.Ops, 5)
	require.Equal(t, []trace.Origin{{0, 1, 0}, {1, 0.25, 0}, {1, 0.75, 1}, {2, 0.25, 0}, {2, 0.75, 1}}, org)
	require.Equal(t, []trace.TensorID{3}, s.Ops[1].In)
	require.Equal(t, []trace.TensorID{10}, s.Ops[1].Out)
	require.Equal(t, []trace.TensorID{1, 3, 5, 7}, s.Ops[3].In)
	require.Equal(t, []trace.TensorID{2, 4, 6, 8}, s.Ops[4].In)
	require.InDelta(t, 10, s.Ops[3].DurUS, 1e-9)
	require.InDelta(t, 2, s.Ops[1].DurUS, 1e-9)
	mem := make([]int64, len(s.Ops))
	for i := range s.Ops {
		mem[i] = s.Ops[i].Mem
	}
	require.Equal(t, []int64{1000, 1100, 1400, 1400, 1400}, mem)
	require.Equal(t, []int{0, 1, 2, 3, 4}, []int{s.Ops[0].Seq, s.Ops[1].Seq, s.Ops[2].Seq, s.Ops[3].Seq, s.Ops[4].Seq})
	require.Len(t, it.Ops, 3, "the iteration split is left as it was")
}

// TestDivideRefuses: ops not made of pieces, and lists that do not agree.
func TestDivideRefuses(t *testing.T) {
	ts := map[trace.TensorID]*trace.Tensor{}
	for id, b := range map[trace.TensorID]int64{1: 10, 2: 20, 3: 10, 4: 20, 5: 30, 6: 40, 7: 4} {
		ts[id] = &trace.Tensor{ID: id, Bytes: b}
	}
	it := &trace.Iteration{Tensors: ts}
	for _, c := range []struct {
		name string
		in   []trace.TensorID
		ok   bool
		p    trace.Pieces
	}{
		{"aten::mm", []trace.TensorID{1, 2}, false, trace.Pieces{}},
		{"aten::_foreach_add_", []trace.TensorID{1, 2, 3, 4}, true, trace.Pieces{N: 2, Lists: 2}},
		{"aten::_fused_adamw_", []trace.TensorID{1, 2, 5, 6}, false, trace.Pieces{}},                      // 30/10 != 40/20, nor all one size
		{"aten::_foreach_add_", []trace.TensorID{1, 2, 1, 4}, false, trace.Pieces{}},                      // a tensor twice
		{"aten::_foreach_mul_", []trace.TensorID{1, 2, 7}, true, trace.Pieces{N: 2, Lists: 1, Shared: 1}}, // a scalar tensor shared
		{"aten::_foreach_zero_", []trace.TensorID{1}, false, trace.Pieces{}},                              // one piece: nothing to split
	} {
		p, ok := trace.Divide(it, &trace.Op{Name: c.name, In: c.in})
		require.Equal(t, c.ok, ok, "%s %v", c.name, c.in)
		require.Equal(t, c.p, p, "%s %v", c.name, c.in)
	}
}

// TestKernelsSplit: each piece gets its share of its op's kernel time; the
// total is kept.
func TestKernelsSplit(t *testing.T) {
	k := &trace.Kernels{Ops: []trace.KernelOp{{Name: "a", KernelUS: 10}, {Name: "b", KernelUS: 40}}}
	s, err := k.Split([]trace.Origin{{0, 1, 0}, {1, 0.25, 0}, {1, 0.75, 1}})
	require.NoError(t, err)
	var sum float64
	for i, op := range s.Ops {
		require.Equal(t, i, op.Seq)
		sum += op.KernelUS
	}
	require.InDelta(t, 50, sum, 1e-9)
	require.Equal(t, "b", s.Ops[2].Name)
	require.False(t, math.IsNaN(s.Ops[1].KernelUS))
	_, err = k.Split([]trace.Origin{{2, 1, 0}})
	require.Error(t, err)
}

// TestGradients: the gradients an optimizer step reads are found, one per
// trained parameter, each the size of its parameter.
func TestGradients(t *testing.T) {
	for name, want := range map[string]int{
		"llama16-bf16.jsonl.gz":        147, // every parameter
		"llama16-lora.jsonl.gz":        128, // the adapters alone: the base weights are frozen
		"llama16-fp16-scaler.jsonl.gz": 147, // the unscale's list
	} {
		tr := testtraces.Read(t, name)
		var found bool
		for _, it := range tr.Iterations {
			g := trace.Gradients(it)
			if len(g) == 0 {
				continue // a step the scaler skipped
			}
			found = true
			require.Len(t, g, want, name)
			for id := range g {
				require.Equal(t, trace.KindActivation, it.Tensors[id].Kind)
			}
		}
		require.True(t, found, name)
	}
	tr := testtraces.Read(t, "llama16-bf16-ckpt.jsonl.gz")
	it := tr.Iterations[1]
	for id := range trace.Gradients(it) {
		// Each gradient is made in the backward.
		made := slices.IndexFunc(it.Ops, func(op trace.Op) bool { return slices.Contains(op.Out, id) })
		require.GreaterOrEqual(t, made, 0)
		require.Equal(t, trace.PhaseBackward, it.Ops[made].Phase, "tensor %d", id)
	}
}
